"""The hash-chained audit log: append inside the caller's transaction, verify, checkpoint.

``chain_hash_n = SHA-256(bytes.fromhex(chain_hash_{n-1}) || canonical_json(event_n))`` where
the first event's predecessor is 32 zero bytes and ``event_n`` is
``{"seq", "occurred_at" (ISO-8601 UTC, microseconds, "Z"), "actor", "action",
"entity_type", "entity_id", "payload"}``. Events are written in the same transaction as
the change they record, so a change without its event (or the reverse) cannot commit.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from registry import audit_tree, webhooks
from registry.canonical import canonical_json, sha256_hex
from registry.errors import InvalidInput
from registry.models import AuditEvent, utcnow

GENESIS_HASH = "0" * 64
# An arbitrary constant naming pairreg's write lock among PostgreSQL advisory locks.
_PG_WRITE_LOCK = 7_201_958_311


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(event: AuditEvent) -> dict[str, Any]:
    """The fields the chain hash covers, in the documented canonical shape."""
    return {
        "seq": event.seq,
        "occurred_at": format_time(event.occurred_at),
        "actor": event.actor,
        "action": event.action,
        "entity_type": event.entity_type,
        "entity_id": event.entity_id,
        "payload": json.loads(event.payload),
    }


def chain_step(prev_hash: str, body: dict[str, Any]) -> str:
    return sha256_hex(bytes.fromhex(prev_hash) + canonical_json(body))


def lock_writes(session: Session) -> None:
    """Serialise registry writers for the rest of this transaction.

    The audit sequence must be gapless and the chain linear, so writers take one lock
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
    """Append one event to the chain inside the caller's transaction."""
    lock_writes(session)
    head = session.execute(
        select(AuditEvent.seq, AuditEvent.chain_hash).order_by(AuditEvent.seq.desc()).limit(1)
    ).first()
    seq = 1 if head is None else head.seq + 1
    prev_hash = GENESIS_HASH if head is None else head.chain_hash
    event = AuditEvent(
        seq=seq,
        occurred_at=utcnow(),
        actor=actor,
        action=action,
        entity_type=entity_type,
        entity_id=str(entity_id),
        payload=canonical_json(payload).decode("utf-8"),
        prev_hash=prev_hash,
        chain_hash="",
    )
    body = event_body(event)
    event.chain_hash = chain_step(prev_hash, body)
    session.add(event)
    session.flush()
    audit_tree.append_leaf(session, seq, body)
    # Decisions owed to webhook subscribers join the outbox in this same transaction.
    webhooks.enqueue(session, event, payload)
    return event


@dataclass
class ChainReport:
    ok: bool
    count: int
    head_seq: int
    head_hash: str
    first_broken_seq: int | None = None
    reason: str | None = None


def verify_chain(session: Session, *, batch: int = 5000) -> ChainReport:
    """Recompute the chain from the first event; stop at the first inconsistency."""
    prev_hash = GENESIS_HASH
    expected_seq = 1
    count = 0
    last_seq = 0
    while True:
        rows = session.scalars(
            select(AuditEvent)
            .where(AuditEvent.seq > last_seq)
            .order_by(AuditEvent.seq)
            .limit(batch)
        ).all()
        if not rows:
            break
        for event in rows:
            if event.seq != expected_seq:
                return ChainReport(
                    False,
                    count,
                    expected_seq - 1,
                    prev_hash,
                    expected_seq,
                    f"sequence gap: expected {expected_seq}, found {event.seq}",
                )
            if event.prev_hash != prev_hash:
                return ChainReport(
                    False,
                    count,
                    event.seq - 1,
                    prev_hash,
                    event.seq,
                    "prev_hash does not match the preceding event",
                )
            try:
                recomputed = chain_step(prev_hash, event_body(event))
            except (ValueError, TypeError) as exc:
                return ChainReport(
                    False,
                    count,
                    event.seq - 1,
                    prev_hash,
                    event.seq,
                    f"event is not canonical JSON: {exc}",
                )
            if recomputed != event.chain_hash:
                return ChainReport(
                    False,
                    count,
                    event.seq - 1,
                    prev_hash,
                    event.seq,
                    "chain hash mismatch: the event was altered",
                )
            prev_hash = event.chain_hash
            expected_seq += 1
            count += 1
            last_seq = event.seq
    return ChainReport(True, count, last_seq, prev_hash)


# --- signed checkpoints -------------------------------------------------------------


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


def checkpoint_body(seq: int, chain_hash: str, signed_at: datetime) -> dict[str, Any]:
    return {"seq": seq, "chain_hash": chain_hash, "signed_at": format_time(signed_at)}


def sign_checkpoint(session: Session, key_path: Path) -> dict[str, Any]:
    """Sign the current head; the result is meant to be stored outside the database."""
    report = verify_chain(session)
    if not report.ok:
        raise InvalidInput(
            f"audit chain is broken at sequence {report.first_broken_seq}: {report.reason}",
            field="audit",
        )
    key = load_private_key(key_path)
    body = checkpoint_body(report.head_seq, report.head_hash, utcnow())
    signature = key.sign(canonical_json(body))
    return {
        **body,
        "signature": base64.b64encode(signature).decode(),
        "public_key": public_pem(key.public_key()),
        "algorithm": "ed25519",
    }


def verify_checkpoint_signature(checkpoint: dict[str, Any]) -> None:
    """Raise InvalidInput when the checkpoint's signature does not verify."""
    try:
        body = checkpoint_body(
            int(checkpoint["seq"]),
            str(checkpoint["chain_hash"]),
            datetime.fromisoformat(str(checkpoint["signed_at"]).replace("Z", "+00:00")),
        )
        pub = serialization.load_pem_public_key(str(checkpoint["public_key"]).encode())
        signature = base64.b64decode(str(checkpoint["signature"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise InvalidInput(f"malformed checkpoint: {exc}", field="checkpoint") from exc
    if not isinstance(pub, Ed25519PublicKey):
        raise InvalidInput("checkpoint public key is not Ed25519", field="checkpoint")
    try:
        pub.verify(signature, canonical_json(body))
    except InvalidSignature as exc:
        raise InvalidInput("checkpoint signature does not verify", field="checkpoint") from exc


def check_extends_checkpoint(session: Session, checkpoint: dict[str, Any]) -> tuple[bool, str]:
    """Does the current log still contain the checkpointed head, unchanged, and verify?"""
    verify_checkpoint_signature(checkpoint)
    report = verify_chain(session)
    if not report.ok:
        return False, f"chain broken at sequence {report.first_broken_seq}: {report.reason}"
    seq = int(checkpoint["seq"])
    if seq == 0:
        return True, "empty checkpoint"
    event = session.get(AuditEvent, seq)
    if event is None:
        return False, f"checkpointed sequence {seq} is missing (log has {report.count} events)"
    if event.chain_hash != checkpoint["chain_hash"]:
        return False, f"chain hash at sequence {seq} differs from the checkpoint"
    return True, f"log extends checkpoint at sequence {seq} ({report.count} events now)"
