"""Prompt suites: built-in categories shipped as JSONL, or user files.

A suite's digest is SHA-256 of canonical JSON of its prompts (sorted by id, keys sorted,
no whitespace), so two measurements on the "same suite" can be checked to really be
on the same prompts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

SUITE_DIR = Path(__file__).parent / "suites"
CATEGORIES = ("code", "sql", "structured", "summarization", "rag", "creative", "adversarial")


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    prompt: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Suite:
    name: str
    prompts: list[Prompt]
    digest: str

    @property
    def categories(self) -> list[str]:
        return sorted({p.category for p in self.prompts})

    def by_category(self, category: str) -> list[Prompt]:
        return [p for p in self.prompts if p.category == category]


def suite_digest(prompts: list[Prompt]) -> str:
    """SHA-256 of ``json.dumps(sorted-by-id [{id, category, prompt}], sort_keys=True,
    separators=(",", ":"))``."""
    items = sorted((p.to_dict() for p in prompts), key=lambda d: d["id"])
    canon = json.dumps(items, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def _parse_line(obj: object, where: str, default_category: str | None) -> Prompt:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "turns" in obj or "question_id" in obj:  # Spec-Bench question format
        for key in ("question_id", "turns"):
            if key not in obj:
                raise ValueError(f"{where}: Spec-Bench record is missing field {key!r}")
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{where}: field 'turns' must be a non-empty list of strings")
        pid, text = str(obj["question_id"]), turns[0]
        category = obj.get("category", default_category)
    else:
        for key in ("id", "prompt"):
            if key not in obj:
                raise ValueError(f"{where}: missing field {key!r}")
        pid, text = obj["id"], obj["prompt"]
        category = obj.get("category", default_category)
        if not isinstance(pid, str | int) or isinstance(pid, bool):
            raise ValueError(f"{where}: field 'id' must be a string")
        pid = str(pid)
        if not isinstance(text, str):
            raise ValueError(f"{where}: field 'prompt' must be a string")
    if not isinstance(category, str) or not category:
        raise ValueError(f"{where}: missing or empty field 'category'")
    if not text:
        raise ValueError(f"{where}: empty prompt")
    return Prompt(id=pid, category=category, prompt=text)


def read_jsonl(path: str | os.PathLike[str], default_category: str | None = None) -> list[Prompt]:
    """Parse a JSONL file of prompts; errors name the file, line and field."""
    p = Path(path)
    prompts: list[Prompt] = []
    seen: set[str] = set()
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{p.name} line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON ({exc.msg})") from None
            prompt = _parse_line(obj, where, default_category)
            if prompt.id in seen:
                raise ValueError(f"{where}: duplicate id {prompt.id!r}")
            seen.add(prompt.id)
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{p.name}: no prompts")
    return prompts


def load_suite(name_or_path: str | os.PathLike[str]) -> Suite:
    """``default`` (all built-in categories), a category name, or a JSONL path (pairreg
    ``{id, category, prompt}`` or Spec-Bench ``{question_id, category, turns}``)."""
    name = str(name_or_path)
    if name == "default":
        prompts = [p for c in CATEGORIES for p in read_jsonl(SUITE_DIR / f"{c}.jsonl")]
        return Suite(name="default", prompts=prompts, digest=suite_digest(prompts))
    if name in CATEGORIES:
        prompts = read_jsonl(SUITE_DIR / f"{name}.jsonl")
        return Suite(name=name, prompts=prompts, digest=suite_digest(prompts))
    path = Path(name)
    if not path.is_file():
        raise ValueError(
            f"unknown suite {name!r}: not a built-in ({', '.join(('default',) + CATEGORIES)}) "
            "and not a file"
        )
    prompts = read_jsonl(path)
    return Suite(name=path.stem, prompts=prompts, digest=suite_digest(prompts))


def builtin_suites() -> list[str]:
    return ["default", *CATEGORIES]
