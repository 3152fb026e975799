"""Outgoing webhooks: pairreg's decisions, delivered per the Standard Webhooks specification
from a durable outbox.

Enqueueing has one place: :func:`registry.trust.audit.append_event` hands every audit event to
:func:`enqueue`, which turns the decisions subscribers care about into a ``webhook_events``
row and one ``webhook_deliveries`` row per matching subscription. Both are written in the
transaction of the decision itself, so what commits is what gets sent.

Delivery (:class:`Dispatcher`) is at least once and in order per subscription (therefore
per deployment): a subscription's next delivery is not attempted while an earlier one is
pending. A failed attempt is retried after ``base * 2**(attempts-1)`` seconds (capped,
with a little jitter); every attempt is recorded. The ``webhook-id`` of an event never
changes between attempts, so a receiver drops duplicates by id. One dispatcher at a time
holds a subscription (a lease row), so several ``pairreg serve`` replicas can each run one.

Headers (https://www.standardwebhooks.com): ``webhook-id``, ``webhook-timestamp`` (Unix
seconds of the attempt), ``webhook-signature: v1,<base64 HMAC-SHA256(key, id.ts.body)>``
where ``key`` is the base64 part of the subscription's ``whsec_`` secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import random
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from registry.canonical import canonical_json
from registry.tables import (
    AuditEvent,
    Deployment,
    DriftFlag,
    Pair,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEvent,
    WebhookSubscription,
    utcnow,
)

logger = logging.getLogger("pairreg.webhooks")

# The decisions that go out, by the audit action that records them.
EVENT_TYPES: tuple[str, ...] = (
    "validation.passed",
    "validation.failed",
    "deployment.promoted",
    "deployment.rolled_back",
    "flag.opened",
    "flag.acknowledged",
    "flag.resolved",
)
_BY_ACTION: dict[str, str] = {
    "deployment.promote": "deployment.promoted",
    "deployment.rollback": "deployment.rolled_back",
    "drift.flag_opened": "flag.opened",
    "integrity.flag_opened": "flag.opened",
    "workload.flag_opened": "flag.opened",
    "drift.flag_acknowledged": "flag.acknowledged",
    "drift.flag_resolved": "flag.resolved",
}
SECRET_PREFIX = "whsec_"
LEASE_SECONDS = 60.0


def event_type_for(action: str, payload: dict[str, Any]) -> str | None:
    """The webhook event type of an audit action, or None when it is not a decision."""
    if action == "pair.validation":
        return "validation.passed" if payload.get("passed") else "validation.failed"
    return _BY_ACTION.get(action)


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 24 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret (its base64 part, decoded)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def message_id(event_id: int) -> str:
    return f"msg_pairreg_{event_id}"


# --- enqueue (inside the decision's transaction) -------------------------------------------


def _live_deployments(session: Session, pair_id: int | None) -> list[str]:
    if pair_id is None:
        return []
    return list(
        session.scalars(
            select(Deployment.name)
            .where(Deployment.current_pair_id == pair_id)
            .order_by(Deployment.name)
        )
    )


def _data(session: Session, event: AuditEvent, payload: dict[str, Any]) -> dict[str, Any]:
    """What a receiver needs to act without calling back: the audit event's payload, where it
    sits in the audit log, and the deployments it concerns."""
    data: dict[str, Any] = {
        "audit_seq": event.seq,
        "action": event.action,
        "actor": event.actor,
        "entity_type": event.entity_type,
        "entity_id": event.entity_id,
        **payload,
    }
    if event.entity_type == "deployment":
        data["deployments"] = [event.entity_id]
    elif event.entity_type == "drift_flag":
        flag = session.get(DriftFlag, int(event.entity_id))
        pair = session.get(Pair, flag.pair_id) if flag and flag.pair_id else None
        if flag is not None:
            data.update(
                flag_id=flag.id,
                kind=flag.kind,
                severity=flag.severity,
                summary=flag.summary,
                state=flag.state,
                pair_digest=pair.pair_digest if pair else None,
                artifact_id=flag.artifact_id,
            )
        data["deployments"] = _live_deployments(session, pair.id if pair else None)
    elif event.entity_type == "pair":
        data["deployments"] = _live_deployments(session, int(event.entity_id))
    else:
        data["deployments"] = []
    return data


def enqueue(session: Session, event: AuditEvent, payload: dict[str, Any]) -> WebhookEvent | None:
    """Write the outbox rows for one audit event, if it is a decision someone subscribed to.

    Called by ``append_event`` only, in the same transaction; nothing is written when no
    active subscription wants the event (the outbox holds what is owed, not a second log).
    """
    etype = event_type_for(event.action, payload)
    if etype is None:
        return None
    subs = list(
        session.scalars(
            select(WebhookSubscription)
            .where(WebhookSubscription.active.is_(True))
            .order_by(WebhookSubscription.id)
        )
    )
    if not subs:
        return None
    data = _data(session, event, payload)
    deployments: list[str] = data["deployments"]
    wanted = [
        s
        for s in subs
        if (not s.events or etype in s.events)
        and (s.deployment is None or s.deployment in deployments)
    ]
    if not wanted:
        return None
    body = {
        "type": etype,
        "timestamp": event.occurred_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "data": data,
    }
    row = WebhookEvent(
        event_type=etype,
        audit_seq=event.seq,
        deployments=deployments,
        body=canonical_json(body).decode("utf-8"),
        created_at=event.occurred_at,
    )
    session.add(row)
    session.flush()
    for sub in wanted:
        session.add(
            WebhookDelivery(
                subscription_id=sub.id,
                event_id=row.id,
                state="pending",
                attempts=0,
                next_attempt_at=event.occurred_at,
            )
        )
    session.flush()
    return row


# --- delivery ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendResult:
    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


Sender = Callable[[str, dict[str, str], bytes, float], SendResult]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a delivery: following it would re-send a signed body to
    an address nobody subscribed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def http_send(url: str, headers: dict[str, str], body: bytes, timeout: float) -> SendResult:
    """POST with the standard library; any answer outside 2xx, or none, is a failure."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            resp.read(65536)
            return SendResult(resp.status)
    except urllib.error.HTTPError as exc:
        return SendResult(exc.code, f"HTTP {exc.code}")
    except (OSError, ValueError) as exc:  # refused, reset, timeout, bad URL
        return SendResult(None, f"{type(exc).__name__}: {exc}"[:500])


def backoff_seconds(
    attempts: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Wait before the next attempt after ``attempts`` failures: ``base * 2**(attempts-1)``,
    capped, plus up to 10 % jitter so that many subscriptions do not retry in lockstep."""
    wait = min(cap, base * 2 ** max(0, attempts - 1))
    return wait * (1 + 0.1 * (rng or random).random())


@dataclass
class DispatchReport:
    delivered: int = 0
    failed: int = 0
    subscriptions: list[int] = field(default_factory=list)


def _take_lease(session: Session, sub_id: int, owner: str, now: datetime) -> bool:
    res = session.execute(
        update(WebhookSubscription)
        .where(
            WebhookSubscription.id == sub_id,
            or_(
                WebhookSubscription.lease_owner.is_(None),
                WebhookSubscription.lease_owner == owner,
                WebhookSubscription.lease_until < now,
            ),
        )
        .values(lease_owner=owner, lease_until=now + timedelta(seconds=LEASE_SECONDS))
        .execution_options(synchronize_session=False)
    )
    return res.rowcount == 1


def _release_lease(session: Session, sub_id: int, owner: str) -> None:
    session.execute(
        update(WebhookSubscription)
        .where(WebhookSubscription.id == sub_id, WebhookSubscription.lease_owner == owner)
        .values(lease_owner=None, lease_until=None)
        .execution_options(synchronize_session=False)
    )


@dataclass
class Dispatcher:
    """Delivers what the outbox owes; ``run_once`` is one pass, ``start`` a thread of passes."""

    db_url: str
    owner: str
    send: Sender = http_send
    backoff_base: float = 1.0
    backoff_max: float = 600.0
    timeout: float = 10.0
    clock: Callable[[], datetime] = utcnow

    def run_once(self) -> DispatchReport:
        from registry.db import session_scope

        report = DispatchReport()
        now = self.clock()
        with session_scope(self.db_url) as s:
            due = list(
                s.scalars(
                    select(WebhookDelivery.subscription_id)
                    .join(
                        WebhookSubscription,
                        WebhookSubscription.id == WebhookDelivery.subscription_id,
                    )
                    .where(
                        WebhookDelivery.state == "pending",
                        WebhookSubscription.active.is_(True),
                    )
                    .distinct()
                )
            )
        for sub_id in sorted(due):
            with session_scope(self.db_url) as s:
                if not _take_lease(s, sub_id, self.owner, now):
                    continue
            report.subscriptions.append(sub_id)
            try:
                self._drain(sub_id, report)
            finally:
                with session_scope(self.db_url) as s:
                    _release_lease(s, sub_id, self.owner)
        return report

    def _drain(self, sub_id: int, report: DispatchReport) -> None:
        """Deliver one subscription's pending events in order, stopping at the first one that
        fails or is not yet due (so nothing overtakes it)."""
        from registry.db import session_scope

        while True:
            now = self.clock()
            with session_scope(self.db_url) as s:
                if not _take_lease(s, sub_id, self.owner, now):  # renew; lost means stop
                    return
                sub = s.get(WebhookSubscription, sub_id)
                d = s.scalar(
                    select(WebhookDelivery)
                    .where(
                        WebhookDelivery.subscription_id == sub_id,
                        WebhookDelivery.state == "pending",
                    )
                    .order_by(WebhookDelivery.id)
                    .limit(1)
                )
                if sub is None or not sub.active or d is None or d.next_attempt_at > now:
                    return
                ev = s.get(WebhookEvent, d.event_id)
                assert ev is not None
                delivery_id, url, secret = d.id, sub.url, sub.secret
                msg_id, body = message_id(ev.id), ev.body.encode("utf-8")
            ts = int(time.time())
            headers = {
                "content-type": "application/json",
                "user-agent": "pairreg-webhooks",
                "webhook-id": msg_id,
                "webhook-timestamp": str(ts),
                "webhook-signature": sign(secret, msg_id, ts, body),
            }
            started = time.perf_counter()
            result = self.send(url, headers, body, self.timeout)
            elapsed = (time.perf_counter() - started) * 1000
            with session_scope(self.db_url) as s:
                d = s.get(WebhookDelivery, delivery_id)
                assert d is not None
                s.add(
                    WebhookAttempt(
                        delivery_id=d.id,
                        attempted_at=self.clock(),
                        status_code=result.status,
                        error=result.error,
                        duration_ms=round(elapsed, 3),
                        dispatcher=self.owner,
                    )
                )
                d.attempts += 1
                d.last_status = result.status
                d.last_error = result.error
                if result.ok:
                    d.state = "delivered"
                    d.delivered_at = self.clock()
                    report.delivered += 1
                else:
                    wait = backoff_seconds(d.attempts, self.backoff_base, self.backoff_max)
                    d.next_attempt_at = self.clock() + timedelta(seconds=wait)
                    report.failed += 1
            if not result.ok:
                logger.info("webhook %s to %s failed: %s", msg_id, url, result.error)
                return

    def start(self, interval: float = 1.0) -> threading.Event:
        """Run passes on a daemon thread every ``interval`` s until the returned event is set."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    self.run_once()
                except DBAPIError as exc:  # the database away: one line, tried again next pass
                    logger.warning(
                        "webhook dispatch: database unavailable: %s",
                        (str(exc.orig).splitlines() or [""])[0],
                    )
                except Exception:  # anything else is a bug: its traceback, and tried again
                    logger.exception("webhook dispatch pass failed")
                stop.wait(interval)

        threading.Thread(target=loop, name="pairreg-webhooks", daemon=True).start()
        return stop


def payload_of(body: str) -> dict[str, Any]:
    return json.loads(body)
