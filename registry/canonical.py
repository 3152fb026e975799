"""Canonical JSON and digests: the one byte form every pairreg hash is taken over.

``json.dumps(obj, sort_keys=True, separators=(",", ":"))`` with the default
``ensure_ascii=True``, encoded UTF-8. Anyone can recompute a digest with the stdlib.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of(obj: Any) -> str:
    """SHA-256 hex of the canonical JSON of ``obj``."""
    return sha256_hex(canonical_json(obj))
