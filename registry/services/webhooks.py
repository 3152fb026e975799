"""Outgoing webhook subscriptions (admin only): create, list, show, disable, and the
deliveries with every attempt. Enqueueing and delivery live in
``registry.integrations.webhooks``."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.errors import Conflict, InvalidInput, NotFound
from registry.integrations.webhooks import EVENT_TYPES, SECRET_PREFIX, message_id, new_secret
from registry.params import Cursor, Limit
from registry.records.core import Page
from registry.records.lifecycle import (
    WebhookAttemptRecord,
    WebhookCreated,
    WebhookDeliveryRecord,
    WebhookRecord,
)
from registry.services.base import page_query
from registry.tables import WebhookAttempt, WebhookDelivery, WebhookEvent, WebhookSubscription
from registry.trust.audit import append_event, lock_writes

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_NAME = re.compile(NAME_PATTERN)
DELIVERY_STATES = ("pending", "delivered")


def _record(session: Session, sub: WebhookSubscription) -> WebhookRecord:
    counts = dict(
        session.execute(
            select(WebhookDelivery.state, func.count())
            .where(WebhookDelivery.subscription_id == sub.id)
            .group_by(WebhookDelivery.state)
        ).all()
    )
    return WebhookRecord(
        id=sub.id,
        name=sub.name,
        url=sub.url,
        events=list(sub.events),
        deployment=sub.deployment,
        active=sub.active,
        created_by=sub.created_by,
        created_at=sub.created_at,
        pending=counts.get("pending", 0),
        delivered=counts.get("delivered", 0),
    )


def _check_url(url: str) -> str:
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2000:
        raise InvalidInput("url must be an http(s) URL of at most 2000 characters", field="url")
    if parts.username or parts.password:
        raise InvalidInput("url must not carry credentials; sign with the secret", field="url")
    return url


def _check_secret(secret: str) -> str:
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not secret.startswith(SECRET_PREFIX) or len(key) < 16 or len(key) > 64:
        raise InvalidInput(
            "secret must be whsec_ followed by base64 of 16 to 64 bytes", field="secret"
        )
    return secret


def _subscription(session: Session, name: str) -> WebhookSubscription:
    sub = session.scalar(select(WebhookSubscription).where(WebhookSubscription.name == name))
    if sub is None:
        raise NotFound(f"no webhook named {name}", field="name")
    return sub


def create_webhook(
    session: Session,
    *,
    name: Annotated[
        str, Field(pattern=NAME_PATTERN, description="Unique; letters, digits, '.', '_', '-'.")
    ],
    url: Annotated[str, Field(description="Where to POST events (http or https).")],
    events: Annotated[
        list[str],
        Field(description=f"Event types to send ({', '.join(EVENT_TYPES)}); empty: all."),
    ] = [],  # noqa: B006 - pydantic copies defaults
    deployment: Annotated[
        str | None, Field(description="Only events that concern this deployment.")
    ] = None,
    secret: Annotated[
        str | None, Field(description="A whsec_ secret to use; one is generated if omitted.")
    ] = None,
    actor: str,
) -> WebhookCreated:
    """Subscribe a receiver to pairreg's decisions; only events after this call are sent."""
    if not _NAME.match(name or ""):
        raise InvalidInput("name must be 1-100 letters, digits, '.', '_' or '-'", field="name")
    url = _check_url(url)
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise InvalidInput(
            f"unknown event type {unknown[0]!r}; known: {', '.join(EVENT_TYPES)}", field="events"
        )
    secret = _check_secret(secret) if secret else new_secret()
    lock_writes(session)
    if session.scalar(select(WebhookSubscription.id).where(WebhookSubscription.name == name)):
        raise Conflict(f"a webhook named {name} already exists", field="name")
    sub = WebhookSubscription(
        name=name,
        url=url,
        secret=secret,
        events=sorted(set(events)),
        deployment=deployment or None,
        active=True,
        created_by=actor,
    )
    session.add(sub)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="webhook.created",
        entity_type="webhook",
        entity_id=sub.id,
        payload={"name": name, "url": url, "events": sub.events, "deployment": sub.deployment},
    )
    return WebhookCreated(webhook=_record(session, sub), secret=secret)


def list_webhooks(
    session: Session, *, cursor: Cursor = None, limit: Limit = 100
) -> Page[WebhookRecord]:
    rows, nxt = page_query(
        session, select(WebhookSubscription), WebhookSubscription.id, cursor, limit
    )
    return Page[WebhookRecord](items=[_record(session, r) for r in rows], next_cursor=nxt)


def get_webhook(session: Session, *, name: str) -> WebhookRecord:
    return _record(session, _subscription(session, name))


def disable_webhook(session: Session, *, name: str, actor: str) -> WebhookRecord:
    """Stop sending to a receiver; what it is owed stays listed (and is sent if re-enabled)."""
    return _set_active(session, name, False, actor)


def enable_webhook(session: Session, *, name: str, actor: str) -> WebhookRecord:
    """Resume sending, starting with what the receiver was owed when it was disabled."""
    return _set_active(session, name, True, actor)


def _set_active(session: Session, name: str, active: bool, actor: str) -> WebhookRecord:
    """Switch a subscription on or off; audited only when it changes (a repeat is a no-op)."""
    lock_writes(session)
    sub = _subscription(session, name)
    if sub.active != active:
        sub.active = active
        append_event(
            session,
            actor=actor,
            action="webhook.enabled" if active else "webhook.disabled",
            entity_type="webhook",
            entity_id=sub.id,
            payload={"name": name},
        )
    return _record(session, sub)


def list_webhook_deliveries(
    session: Session,
    *,
    name: str,
    state: str | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
) -> Page[WebhookDeliveryRecord]:
    """A receiver's deliveries in the order they are sent, each with every attempt."""
    sub = _subscription(session, name)
    stmt = select(WebhookDelivery).where(WebhookDelivery.subscription_id == sub.id)
    if state:
        if state not in DELIVERY_STATES:
            raise InvalidInput(f"state must be one of {', '.join(DELIVERY_STATES)}", field="state")
        stmt = stmt.where(WebhookDelivery.state == state)
    rows, nxt = page_query(session, stmt, WebhookDelivery.id, cursor, limit)
    items = []
    for d in rows:
        ev = session.get(WebhookEvent, d.event_id)
        assert ev is not None
        attempts = session.scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id == d.id)
            .order_by(WebhookAttempt.id)
        )
        items.append(
            WebhookDeliveryRecord(
                id=d.id,
                webhook=sub.name,
                message_id=message_id(ev.id),
                event_type=ev.event_type,
                audit_seq=ev.audit_seq,
                deployments=list(ev.deployments),
                state=d.state,
                attempts=d.attempts,
                next_attempt_at=d.next_attempt_at if d.state == "pending" else None,
                last_status=d.last_status,
                last_error=d.last_error,
                delivered_at=d.delivered_at,
                payload=json.loads(ev.body),
                attempt_log=[
                    WebhookAttemptRecord(
                        attempted_at=a.attempted_at,
                        status_code=a.status_code,
                        error=a.error,
                        duration_ms=a.duration_ms,
                        dispatcher=a.dispatcher,
                    )
                    for a in attempts
                ],
            )
        )
    return Page[WebhookDeliveryRecord](items=items, next_cursor=nxt)
