"""The audit log: append inside the caller's transaction; the log's signing key.

Each event is ``{"seq", "occurred_at" (ISO-8601 UTC, microseconds, "Z"), "actor", "action",
"entity_type", "entity_id", "payload"}``; its canonical JSON is a leaf of the RFC 6962
Merkle tree (``registry.audit_tree``), which the log signs as C2SP checkpoints
(``registry.services.transparency``). Events are written in the same transaction as the
change they record, so a change without its event (or the reverse) cannot commit.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from registry import audit_tree, webhooks
from registry.canonical import canonical_json
from registry.errors import InvalidInput
from registry.models import AuditEvent, utcnow

# An arbitrary constant naming pairreg's write lock among PostgreSQL advisory locks.
_PG_WRITE_LOCK = 7_201_958_311


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(event: AuditEvent) -> dict[str, Any]:
    """The fields a leaf covers, in the documented canonical shape."""
    return {
        "seq": event.seq,
        "occurred_at": format_time(event.occurred_at),
        "actor": event.actor,
        "action": event.action,
        "entity_type": event.entity_type,
        "entity_id": event.entity_id,
        "payload": json.loads(event.payload),
    }


def lock_writes(session: Session) -> None:
    """Serialise registry writers for the rest of this transaction.

    The audit sequence must be gapless and the tree append-only, so writers take one lock
    before reading anything they will write against. SQLite transactions already begin
    with BEGIN IMMEDIATE, which is the same lock.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_WRITE_LOCK})


def append_event(
    session: Session,
    *,
    actor: str,
    action: str,
    entity_type: str,
    entity_id: str | int,
    payload: dict[str, Any],
) -> AuditEvent:
    """Append one event (and its leaf) inside the caller's transaction."""
    lock_writes(session)
    head = session.scalar(select(AuditEvent.seq).order_by(AuditEvent.seq.desc()).limit(1))
    seq = 1 if head is None else head + 1
    event = AuditEvent(
        seq=seq,
        occurred_at=utcnow(),
        actor=actor,
        action=action,
        entity_type=entity_type,
        entity_id=str(entity_id),
        payload=canonical_json(payload).decode("utf-8"),
    )
    body = event_body(event)
    session.add(event)
    session.flush()
    audit_tree.append_leaf(session, seq, body)
    # Decisions owed to webhook subscribers join the outbox in this same transaction.
    webhooks.enqueue(session, event, payload)
    return event


# --- the log's signing key -------------------------------------------------------------


def ensure_signing_key(path: Path, public_path: Path) -> Ed25519PublicKey:
    """Create the Ed25519 key kept outside the database (mode 0600), once."""
    if path.exists():
        return load_private_key(path).public_key()
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.touch(mode=0o600)
    path.write_bytes(raw)
    path.chmod(0o600)
    public_path.write_bytes(public_pem(key.public_key()).encode())
    return key.public_key()


def load_private_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(f"{path} is not an Ed25519 private key", field="key")
    return key


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
