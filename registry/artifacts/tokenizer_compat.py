"""Tokenizer-exact compatibility between a draft and its target.

Speculative decoding hands token *ids* from the draft to the target. If one token has a
different id in the two tokenizers, output is silently corrupted (SGLang STANDALONE with
a different draft vocabulary does exactly that), so a file digest is not enough: the
token→id maps themselves are compared, with the special tokens and chat templates.

The verdict, from :func:`compare_maps` (full maps) or :func:`compare_profiles` (the
compact profile stored in an artifact's facts at registration):

* identical maps on the target's vocabulary → pass;
* the draft's embedding padded past the target's vocabulary by at most
  :data:`MAX_PADDING` ids, identical map on the shared range → pass with a note (vLLM
  allows this; the padded ids are never proposed);
* any token mapped to a different id → refused, naming the first differing token (lowest
  target id) and both ids; a draft smaller than the target, or padded by more → refused;
* different special-token roles or chat templates → a warning.

The profile keeps, per block of :data:`BLOCK` ids, a digest of the tokens in id order:
two profiles locate the first differing block without the maps; naming the token needs
the maps, read from the artifacts' verified tokenizer files when they are on this
machine.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.artifacts.tokenizer_digest import load_vocab

MAX_PADDING = 128
BLOCK = 1024
SPECIAL_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass
class Findings:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def special_tokens(directory: str | os.PathLike[str]) -> dict[str, str | None]:
    """``bos/eos/pad/unk_token`` as ``tokenizer_config.json`` (else
    ``special_tokens_map.json``) names them."""
    root = Path(directory)
    cfg = _read_json(root / "tokenizer_config.json")
    smap = _read_json(root / "special_tokens_map.json")
    return {r: _token_text(cfg.get(r, smap.get(r))) for r in SPECIAL_ROLES}


def chat_template_text(directory: str | os.PathLike[str]) -> str | None:
    """The chat template as transformers reads it: ``chat_template.jinja``, else the
    ``chat_template`` of ``tokenizer_config.json`` (a string, or a list of named ones)."""
    root = Path(directory)
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tmpl = _read_json(root / "tokenizer_config.json").get("chat_template")
    if isinstance(tmpl, list | dict):
        return json.dumps(tmpl, sort_keys=True)
    return tmpl if isinstance(tmpl, str) and tmpl else None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def block_digests(vocab: dict[str, int]) -> list[str]:
    """Per block of :data:`BLOCK` ids, a digest of the tokens at those ids in order (a
    hole is ``null``)."""
    if not vocab:
        return []
    inverse = {i: t for t, i in vocab.items()}
    top = max(inverse) + 1
    out = []
    for start in range(0, top, BLOCK):
        tokens = [inverse.get(i) for i in range(start, min(start + BLOCK, top))]
        out.append(_digest(json.dumps(tokens, separators=(",", ":")))[:16])
    return out


def profile(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The compact tokenizer profile stored in an artifact's facts (``None`` without a
    readable vocabulary)."""
    loaded = load_vocab(directory)
    if loaded is None:
        return None
    vocab, _ = loaded
    tmpl = chat_template_text(directory)
    return {
        "size": len(vocab),
        "max_id": max(vocab.values()) if vocab else -1,
        "block": BLOCK,
        "blocks": block_digests(vocab),
        "special_tokens": special_tokens(directory),
        "chat_template_digest": _digest(tmpl) if tmpl is not None else None,
    }


def _embedding_sizes(
    t_size: int | None, d_size: int | None, t_max: int, d_max: int
) -> tuple[int, int]:
    return (t_size or t_max + 1, d_size or d_max + 1)


def _size_findings(tv: int, dv: int, out: Findings) -> bool:
    """Embedding sizes: False when that alone refuses the pair."""
    if dv < tv:
        out.errors.append(
            f"the draft's vocabulary ({dv} ids) is smaller than the target's ({tv}): "
            "target tokens beyond it could never be proposed"
        )
        return False
    if dv - tv > MAX_PADDING:
        out.errors.append(
            f"the draft's embedding exceeds the target's vocabulary by {dv - tv} ids "
            f"(at most {MAX_PADDING} of padding is allowed)"
        )
        return False
    if dv > tv:
        out.notes.append(
            f"the draft's embedding is padded {dv - tv} ids past the target's vocabulary "
            f"({tv}); the shared range maps identically and padded ids are never proposed"
        )
    return True


def _meta_findings(t: dict[str, Any], d: dict[str, Any], out: Findings) -> None:
    ts, ds = t.get("special_tokens") or {}, d.get("special_tokens") or {}
    for role in SPECIAL_ROLES:
        if ts.get(role) != ds.get(role) and ts.get(role) and ds.get(role):
            out.warnings.append(
                f"special token {role} differs: target {ts.get(role)!r}, draft {ds.get(role)!r}"
            )
    tt, dt = t.get("chat_template_digest"), d.get("chat_template_digest")
    if tt != dt:
        if tt and dt:
            out.warnings.append(
                f"chat templates differ (target {tt[:12]}, draft {dt[:12]}): the draft was "
                "trained on another rendering of the same chats"
            )
        else:
            side = "target" if tt else "draft"
            out.warnings.append(f"only the {side} ships a chat template")


def compare_maps(
    target: dict[str, int],
    draft: dict[str, int],
    target_size: int | None = None,
    draft_size: int | None = None,
) -> Findings:
    """Exact comparison of two token→id maps; ``*_size`` are the embedding sizes from
    ``config.json`` (``vocab_size``), when known."""
    out = Findings()
    tv, dv = _embedding_sizes(
        target_size, draft_size, max(target.values(), default=-1), max(draft.values(), default=-1)
    )
    if not _size_findings(tv, dv, out):
        return out
    first = first_difference(target, draft, tv, dv)
    if first is not None:
        out.errors.append(first)
    return out


def first_difference(
    target: dict[str, int], draft: dict[str, int], tv: int, dv: int | None = None
) -> str | None:
    """The first token (lowest target id) whose ids differ, as one readable line; ``None``
    when the maps are identical except for draft-only tokens in the padded range
    ``[tv, dv)``."""
    dv = tv if dv is None else dv
    for token, tid in sorted(target.items(), key=lambda kv: kv[1]):
        did = draft.get(token)
        if did != tid:
            where = f"id {did}" if did is not None else "no id"
            return (
                f"vocabulary mismatch: token {token!r} is id {tid} in the target but {where} "
                "in the draft"
            )
    extra = sorted((i, t) for t, i in draft.items() if t not in target and not tv <= i < dv)
    if extra:
        did, token = extra[0]
        return (
            f"vocabulary mismatch: token {token!r} is id {did} in the draft but has no id "
            "in the target"
        )
    return None


def compare_profiles(
    t: dict[str, Any],
    d: dict[str, Any],
    target_size: int | None = None,
    draft_size: int | None = None,
    load_maps: Callable[[], tuple[dict[str, int], dict[str, int]] | None] | None = None,
) -> Findings:
    """The verdict from two stored profiles; ``load_maps`` (the files, when at hand) is
    called only when the profiles differ, to name the first differing token instead of
    its block."""
    out = Findings()
    tv, dv = _embedding_sizes(target_size, draft_size, t["max_id"], d["max_id"])
    if _size_findings(tv, dv, out):
        tb, db = t.get("blocks") or [], d.get("blocks") or []
        n = max(len(tb), len(db))
        differs = next(
            (
                i for i in range(n)
                if (tb[i] if i < len(tb) else None) != (db[i] if i < len(db) else None)
            ),
            None,
        )  # fmt: skip
        # blocks cannot tell draft-only tokens in the padded range from real differences:
        # only the maps can, so without them any difference refuses
        if differs is not None:
            maps = load_maps() if load_maps is not None else None
            if maps is None:
                lo, hi = differs * BLOCK, (differs + 1) * BLOCK - 1
                out.errors.append(
                    f"vocabulary mismatch: the token→id maps differ at ids {lo}–{hi} (the "
                    "tokenizer files are not on this machine to name the token)"
                )
            else:
                line = first_difference(*maps, tv, dv)
                if line is not None:
                    out.errors.append(line)
    _meta_findings(t, d, out)
    return out
