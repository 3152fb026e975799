"""Prompt suites: built-in categories shipped as JSONL, or user files.

A prompt is raw text (``prompt``: base models, completion endpoints) or a chat
(``messages`` in the OpenAI format, possibly multi-turn), rendered by the target's own
chat template (:mod:`runner.render`). Every built-in category has both forms: ``default``
and ``<category>`` are raw, ``chat`` and ``chat:<category>`` the chat form.

A suite's digest is SHA-256 of canonical JSON of its prompts (sorted by id, keys sorted,
no whitespace; a raw prompt as ``{id, category, prompt}``, a chat prompt as ``{id,
category, messages}``), so two measurements on the "same suite" can be checked to really
be on the same prompts, messages included.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUITE_DIR = Path(__file__).parent / "suites"
CATEGORIES = (
    "code", "sql", "structured", "summarization", "rag", "creative", "adversarial",
    # Spec-Bench's categories that the suites above lacked
    "translation", "qa", "math_reasoning", "multi_turn",
)  # fmt: skip
CHAT_PREFIX = "chat:"
ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclass(frozen=True)
class Prompt:
    """One suite prompt: ``prompt`` (raw text) or ``messages`` (a chat), never both."""

    id: str
    category: str
    prompt: str | None = None
    messages: tuple[dict[str, str], ...] | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(f"prompt {self.id!r}: give exactly one of 'prompt' or 'messages'")

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "category": self.category}
        if self.messages is not None:
            d["messages"] = [dict(m) for m in self.messages]
        else:
            d["prompt"] = self.prompt
        return d

    def text(self) -> str:
        """A one-line-ish view for logs and tables (the last message of a chat)."""
        if self.messages is not None:
            return self.messages[-1].get("content", "")
        return self.prompt or ""


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
    """SHA-256 of ``json.dumps(sorted-by-id [{id, category, prompt | messages}],
    sort_keys=True, separators=(",", ":"))``."""
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
        if "id" not in obj:
            raise ValueError(f"{where}: missing field 'id'")
        if "prompt" not in obj and "messages" not in obj:
            raise ValueError(f"{where}: missing field 'prompt' (raw text) or 'messages' (chat)")
        if "prompt" in obj and "messages" in obj:
            raise ValueError(f"{where}: give only one of 'prompt' (raw) or 'messages' (chat)")
        pid = obj["id"]
        category = obj.get("category", default_category)
        if not isinstance(pid, str | int) or isinstance(pid, bool):
            raise ValueError(f"{where}: field 'id' must be a string")
        pid = str(pid)
        if "messages" in obj:
            if not isinstance(category, str) or not category:
                raise ValueError(f"{where}: missing or empty field 'category'")
            messages = _parse_messages(obj["messages"], where)
            return Prompt(id=pid, category=category, messages=messages)
        text = obj["prompt"]
        if not isinstance(text, str):
            raise ValueError(f"{where}: field 'prompt' must be a string")
    if not isinstance(category, str) or not category:
        raise ValueError(f"{where}: missing or empty field 'category'")
    if not text:
        raise ValueError(f"{where}: empty prompt")
    return Prompt(id=pid, category=category, prompt=text)


def _parse_messages(value: object, where: str) -> tuple[dict[str, str], ...]:
    """OpenAI chat messages: a non-empty list of ``{role, content}`` with string content."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: field 'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(value):
        field = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{where}: {field} must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"{where}: {field}.role must be one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"{where}: {field}.content must be a string")
        out.append({"role": role, "content": content})
    if out[-1]["role"] == "assistant":
        raise ValueError(f"{where}: the last message is the assistant's; nothing to answer")
    return tuple(out)


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


def _builtin(category: str, chat: bool) -> list[Prompt]:
    return read_jsonl(SUITE_DIR / ("chat" if chat else "") / f"{category}.jsonl")


def load_suite(name_or_path: str | os.PathLike[str]) -> Suite:
    """``default`` (all built-in categories, raw), a category name (raw), ``chat`` or
    ``chat:<category>`` (their chat form), or a JSONL path (pairreg ``{id, category,
    prompt}`` / ``{id, category, messages}`` or Spec-Bench ``{question_id, category,
    turns}``)."""
    name = str(name_or_path)
    chat = name == "chat" or name.startswith(CHAT_PREFIX)
    base = "default" if name == "chat" else name.removeprefix(CHAT_PREFIX)
    if base == "default":
        prompts = [p for c in CATEGORIES for p in _builtin(c, chat)]
        return Suite(name=name, prompts=prompts, digest=suite_digest(prompts))
    if base in CATEGORIES:
        prompts = _builtin(base, chat)
        return Suite(name=name, prompts=prompts, digest=suite_digest(prompts))
    path = Path(name)
    if not path.is_file():
        raise ValueError(
            f"unknown suite {name!r}: not a built-in ({', '.join(builtin_suites())}) and not a file"
        )
    prompts = read_jsonl(path)
    return Suite(name=path.stem, prompts=prompts, digest=suite_digest(prompts))


def builtin_suites() -> list[str]:
    return ["default", *CATEGORIES, "chat", *(CHAT_PREFIX + c for c in CATEGORIES)]
