"""Reading and verifying the audit log (writing happens inside each service's transaction)."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import audit, audit_tree
from registry.errors import InvalidInput
from registry.models import AuditEvent
from registry.params import Cursor, Limit, Timestamp
from registry.records import AuditEventRecord, ChainVerifyResult, Checkpoint, Page, from_row
from registry.services import transparency
from registry.services.base import operation, page_query
from registry.settings import get_settings


def to_record(event: AuditEvent) -> AuditEventRecord:
    return from_row(AuditEventRecord, event, payload=json.loads(event.payload))


@operation
def list_audit_events(
    session: Session,
    *,
    entity_type: str | None = None,
    entity_id: str | None = None,
    by_actor: str | None = None,
    action: str | None = None,
    since: Timestamp | None = None,
    until: Timestamp | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
) -> Page[AuditEventRecord]:
    """Events in sequence order. The actor filter is ``by_actor``: a parameter named
    ``actor`` means the caller's identity to every service, and the API and embedded
    backend fill it in, which would silently filter the log to the caller's own events."""
    stmt = select(AuditEvent)
    if entity_id and not entity_type:
        raise InvalidInput("entity_id needs entity_type", field="entity_id")
    if entity_type:
        stmt = stmt.where(AuditEvent.entity_type == entity_type)
    if entity_id:
        stmt = stmt.where(AuditEvent.entity_id == str(entity_id))
    if by_actor:
        stmt = stmt.where(AuditEvent.actor == by_actor)
    if action:
        stmt = stmt.where(AuditEvent.action == action)
    for value, name in ((since, "since"), (until, "until")):
        if value is not None and value.tzinfo is None:
            raise InvalidInput(f"{name} must include a timezone (e.g. Z)", field=name)
    if since:
        stmt = stmt.where(AuditEvent.occurred_at >= since)
    if until:
        stmt = stmt.where(AuditEvent.occurred_at < until)
    rows, next_cursor = page_query(session, stmt, AuditEvent.seq, cursor, limit)
    return Page[AuditEventRecord](items=[to_record(e) for e in rows], next_cursor=next_cursor)


@operation
def verify_audit_chain(
    session: Session, *, checkpoint: Checkpoint | None = None
) -> ChainVerifyResult:
    """Recompute the chain; with a checkpoint, also prove the log still extends it."""
    report = audit.verify_chain(session)
    result = ChainVerifyResult(
        ok=report.ok,
        count=report.count,
        head_seq=report.head_seq,
        head_hash=report.head_hash,
        first_broken_seq=report.first_broken_seq,
        reason=report.reason,
    )
    if report.ok:
        # The chain is recomputable by whoever can write the database: what they cannot
        # recompute is the log's signature over the tree of the same events.
        tree = audit_tree.verify_tree(session)
        if not tree.ok:
            result.signed_ok = False
            result.signed_detail = (
                f"the Merkle tree over the same events does not verify at sequence "
                f"{tree.first_bad_seq}: {tree.reason}"
            )
        else:
            signed = transparency.check_signed_checkpoints(
                session, tree, transparency.published_verifier()
            )
            result.signed_size, result.signed_ok = signed.size, signed.ok
            result.signed_detail = signed.detail
        result.ok = bool(result.signed_ok)
    if checkpoint is not None:
        ok, detail = audit.check_extends_checkpoint(
            session, checkpoint.model_dump(), trusted_public_pem=_published_pem()
        )
        result.checkpoint_ok = ok
        result.checkpoint_detail = detail
        result.ok = result.ok and ok
    return result


def _published_pem() -> str | None:
    path = get_settings().public_key_path
    return path.read_text() if path.exists() else None


@operation
def create_audit_checkpoint(session: Session, *, key_path: str | None = None) -> Checkpoint:
    """Sign the current head with the Ed25519 key kept outside the database."""
    key_path = Path(key_path) if key_path else get_settings().signing_key_path
    if not key_path.exists():
        raise InvalidInput(f"no signing key at {key_path}: run `pairreg init`", field="key")
    return Checkpoint.model_validate(audit.sign_checkpoint(session, key_path))
