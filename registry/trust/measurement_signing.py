"""Signed measurements: a worker signs the canonical statement of what it measured.

A worker holding an Ed25519 private key (its public half registered by an admin for the
worker's token, ``register_worker_key``) signs, for each job it completes, a statement that
binds the pair, the job, the suite, the settings, the runner version and a digest of the
numbers gates read (overall, per-category and per-prompt counters). The registry checks the
signature when the result arrives and stores it beside the measurement, so anyone holding
the worker's public key can verify a measurement later, offline, from its JSON record alone
(:func:`verify_record`): changing one counter in the database breaks it.

Only the standard library and ``cryptography``: an outside verifier needs nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from registry.canonical import canonical_json, digest_of
from registry.errors import InvalidInput

STATEMENT_KIND = "pairreg.measurement/v1"
# The statement's fields that must equal the stored measurement's own.
BOUND_FIELDS = (
    "pair_digest",
    "job_id",
    "suite_name",
    "suite_digest",
    "settings_digest",
    "runner_version",
)


def clean(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become null (PostgreSQL JSON refuses them); what is stored
    and what is signed are the same cleaned values."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def result_digest(overall: Any, categories: Any, prompts: Any) -> str:
    """Digest of the numbers gates read (as stored: cleaned)."""
    return digest_of(
        {
            "overall": clean(overall or {}),
            "categories": clean(categories),
            "prompts": clean(prompts),
        }
    )


def statement(
    *,
    pair_digest: str,
    job_id: int | None,
    suite_name: str,
    suite_digest: str,
    settings_digest: str,
    runner_version: str,
    result: dict[str, Any],
) -> dict[str, Any]:
    """The canonical statement of one measurement result (what a worker signs)."""
    return {
        "kind": STATEMENT_KIND,
        "pair_digest": pair_digest,
        "job_id": job_id,
        "suite_name": suite_name,
        "suite_digest": suite_digest,
        "settings_digest": settings_digest,
        "runner_version": str(runner_version),
        "result_digest": result_digest(
            result.get("overall"), result.get("categories"), result.get("prompts")
        ),
    }


def public_key_raw(key: str) -> bytes:
    """An Ed25519 public key given as 64 hex characters (raw) or as a PEM SubjectPublicKeyInfo."""
    text = key.strip()
    if "BEGIN" in text:
        try:
            loaded = serialization.load_pem_public_key(text.encode())
        except ValueError as exc:
            raise InvalidInput(f"not a PEM public key: {exc}", field="public_key") from exc
        if not isinstance(loaded, Ed25519PublicKey):
            raise InvalidInput("the public key must be Ed25519", field="public_key")
        return loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise InvalidInput(
            "public_key must be an Ed25519 key: 64 hex characters or a PEM block",
            field="public_key",
        )
    return raw


def fingerprint(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def sign(private_key: Ed25519PrivateKey, stmt: dict[str, Any]) -> dict[str, Any]:
    """``{statement, key, signature}`` as the registry stores it."""
    raw = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return {
        "statement": stmt,
        "key": fingerprint(raw),
        "signature": base64.b64encode(private_key.sign(canonical_json(stmt))).decode(),
    }


def check_signature(signed: Any, raw_public_key: bytes) -> str | None:
    """None when ``signed`` carries a valid signature by this key, else why not."""
    if not isinstance(signed, dict) or not {"statement", "key", "signature"} <= set(signed):
        return "not a signed statement (statement, key, signature)"
    if signed["key"] != fingerprint(raw_public_key):
        return f"signed by key {signed['key']}, not {fingerprint(raw_public_key)}"
    try:
        sig = base64.b64decode(str(signed["signature"]), validate=True)
        Ed25519PublicKey.from_public_bytes(raw_public_key).verify(
            sig, canonical_json(signed["statement"])
        )
    except (InvalidSignature, ValueError):
        return "the signature does not verify"
    return None


def verify_record(record: dict[str, Any], public_key: str) -> list[str]:
    """Offline check of a measurement record (``get_measurement`` JSON, prompts included)
    against a worker's public key: the problems found, none when it verifies."""
    signed = record.get("signature")
    if not signed:
        return ["the measurement is not signed"]
    why = check_signature(signed, public_key_raw(public_key))
    if why:
        return [why]
    stmt = signed["statement"]
    problems = [
        f"statement {f} is {stmt.get(f)!r}, the record says {record.get(f)!r}"
        for f in BOUND_FIELDS
        if stmt.get(f) != record.get(f)
    ]
    if record.get("prompts") is None:
        problems.append("the record has no per-prompt counters (fetch it with prompts)")
    elif stmt.get("result_digest") != result_digest(
        record.get("overall"), record.get("categories"), record.get("prompts")
    ):
        problems.append("the stored numbers differ from the signed ones")
    return problems
