"""The canonical bytes of a request tag, fast: the ingest hot path's encoder.

A tag digest is ``SHA-256(canonical_json(tag_body(...)))`` (``registry.trust.bundle_verify``, the
form an auditor recomputes). ``json.dumps(..., sort_keys=True)`` over a fresh dict per tag
costs more than everything else ingest does in Python, yet the body always has the same
seven keys, so its canonical form is a fixed template: keys in sorted order, strings through
the stdlib's own C escaper (``ensure_ascii``, exactly what ``json.dumps`` uses), integers
by ``int.__repr__``. Anything outside the shape the template knows (an ``int`` subclass, a
spec with other keys or values) falls back to ``canonical_json``, so the bytes are identical
to the slow path's for every input; ``tests/requests/test_tag_encoding.py`` checks that.
"""

from __future__ import annotations

import hashlib
import json.encoder
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from registry.canonical import canonical_json
from registry.trust.bundle_verify import format_time

json_string = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]

_INT = frozenset((int,))
_SPEC_KEYS = frozenset(
    ("acceptance_histogram", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps")
)


def time_text(value: datetime) -> str:
    """``format_time(value)`` (UTC, microseconds, ``Z``) without ``strftime``."""
    utc = value.astimezone(UTC)
    if utc.year < 1000:  # strftime's %Y does not pad; keep its form exactly
        return format_time(value)
    return utc.isoformat(timespec="microseconds")[:-6] + "Z"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def time_texts() -> Callable[[datetime], str]:
    """:func:`time_text` with a cache of the text up to the second (one per batch): a batch
    spans few seconds, and ``isoformat`` costs more than the rest of a tag's digest. The
    instant's whole seconds since the epoch key the cached ``YYYY-MM-DDTHH:MM:SS`` prefix;
    the microseconds are appended, so every text equals ``time_text(value)``."""
    cache: dict[int, str] = {}

    def text(value: datetime) -> str:
        d = value - _EPOCH  # exact: days, seconds in [0, 86400), microseconds
        key = d.days * 86400 + d.seconds
        prefix = cache.get(key)
        if prefix is None:
            prefix = cache[key] = time_text(value)[:-8]  # drop ".ffffffZ"
        return f"{prefix}.{d.microseconds:06d}Z"

    return text


def validated_counters_json(steps: int, drafted: int, accepted: int, histogram: Any) -> str:
    """:func:`counters_json` for counters pydantic validated as ``int``/``list[int]``, which
    it always returns as exact ``int`` (``tests/requests/test_tag_encoding.py`` checks
    that), so no type is checked here."""
    h = "null" if histogram is None else "[" + ",".join(map(str, histogram)) + "]"
    return (
        f'{{"acceptance_histogram":{h},"num_accepted_draft_tokens":{accepted},'
        f'"num_draft_tokens":{drafted},"num_spec_steps":{steps}}}'
    )


def counters_json(steps: Any, drafted: Any, accepted: Any, histogram: Any) -> str | None:
    """Canonical JSON of spec counters given as values (None when they are not plain ints)."""
    if type(steps) is int and type(drafted) is int and type(accepted) is int:
        if histogram is None:
            h = "null"
        elif type(histogram) is list and set(map(type, histogram)) <= _INT:
            h = "[" + ",".join(map(str, histogram)) + "]"
        else:
            return None
        return (
            f'{{"acceptance_histogram":{h},"num_accepted_draft_tokens":{accepted},'
            f'"num_draft_tokens":{drafted},"num_spec_steps":{steps}}}'
        )
    return None


def spec_json(spec: dict[str, Any] | None) -> str:
    """Canonical JSON of a tag's spec counters (``null`` when absent)."""
    if spec is None:
        return "null"
    if spec.keys() == _SPEC_KEYS:
        fast = counters_json(
            spec["num_spec_steps"],
            spec["num_draft_tokens"],
            spec["num_accepted_draft_tokens"],
            spec["acceptance_histogram"],
        )
        if fast is not None:
            return fast
    return canonical_json(spec).decode("ascii")


def tag_json(
    request_id: str,
    deployment_json: str,
    pair_digest_json: str,
    served_at: str,
    input_tokens: int,
    output_tokens: int,
    spec: str,
) -> bytes:
    """``canonical_json(tag_body(...))`` from pre-encoded parts: ``deployment_json`` and
    ``pair_digest_json`` are ``json_string(...)`` of the name and digest (one per batch and
    pair), ``served_at`` is ``time_text(...)``, ``spec`` is ``spec_json(...)``."""
    return (
        f'{{"deployment":{deployment_json},"input_tokens":{int(input_tokens)!r},'
        f'"output_tokens":{int(output_tokens)!r},"pair_digest":{pair_digest_json},'
        f'"request_id":{json_string(request_id)},"served_at":"{served_at}","spec":{spec}}}'
    ).encode("ascii")


def tag_digest_hex(*parts: Any, **named: Any) -> str:
    """SHA-256 hex of :func:`tag_json` (same arguments)."""
    return hashlib.sha256(tag_json(*parts, **named)).hexdigest()
