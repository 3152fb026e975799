"""Reading the audit log (writing happens inside each service's transaction; proofs,
checkpoints and verification are in :mod:`registry.services.transparency`)."""

from __future__ import annotations

import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.errors import InvalidInput
from registry.params import Cursor, Limit, Timestamp
from registry.records.core import AuditEventRecord, Page, from_row
from registry.services.base import page_query
from registry.tables import AuditEvent


def to_record(event: AuditEvent) -> AuditEventRecord:
    return from_row(AuditEventRecord, event, payload=json.loads(event.payload))


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
