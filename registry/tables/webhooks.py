"""Lifecycle tables: outgoing webhook subscriptions with their durable outbox, and the
MLflow registry webhooks pairreg receives.

Outgoing: a decision (validation, promotion, rollback, a flag opened or closed) writes one
``webhook_events`` row and one ``webhook_deliveries`` row per matching subscription in the
same transaction as its audit event, so a decision that commits cannot lose its webhook
and a rolled-back one cannot send one. Every HTTP attempt is a ``webhook_attempts`` row.

Incoming: ``mlflow_sources`` maps an MLflow registered model to a pairreg lineage;
``mlflow_deliveries`` remembers every accepted delivery id (a replay changes nothing).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from registry.tables.base import Base, UTCDateTime, utcnow


class WebhookSubscription(Base):
    """Where pairreg sends its decisions, signed with this subscription's own secret."""

    __tablename__ = "webhook_subscriptions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    url: Mapped[str] = mapped_column(String(2000))
    # ``whsec_<base64>``: needed in clear to sign; shown once at creation, never listed.
    secret: Mapped[str] = mapped_column(String(200))
    events: Mapped[list[str]] = mapped_column(JSON)
    deployment: Mapped[str | None] = mapped_column(String(100))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # One dispatcher at a time per subscription keeps its deliveries in order.
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookEvent(Base):
    """One outgoing event: its type, the signed body and the audit event it came from."""

    __tablename__ = "webhook_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    event_type: Mapped[str] = mapped_column(String(64))
    audit_seq: Mapped[int] = mapped_column(Integer, unique=True)
    deployments: Mapped[list[str]] = mapped_column(JSON)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookDelivery(Base):
    """One event owed to one subscription: pending until a 2xx answer."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "subscription_id", "state", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    subscription_id: Mapped[int] = mapped_column(ForeignKey("webhook_subscriptions.id"))
    event_id: Mapped[int] = mapped_column(ForeignKey("webhook_events.id"), index=True)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebhookAttempt(Base):
    """One HTTP attempt at a delivery, kept so an admin can see what the receiver said."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("webhook_deliveries.id"), index=True)
    attempted_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float] = mapped_column(Float)
    dispatcher: Mapped[str] = mapped_column(String(100))


class MlflowSource(Base):
    """An MLflow registered model whose versions become artifacts of a pairreg lineage."""

    __tablename__ = "mlflow_sources"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    registered_model: Mapped[str] = mapped_column(String(500), unique=True)
    lineage: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    aliases: Mapped[list[str]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class MlflowDelivery(Base):
    """A webhook delivery accepted from MLflow; its id is never acted on twice."""

    __tablename__ = "mlflow_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    delivery_id: Mapped[str] = mapped_column(String(200), unique=True)
    event: Mapped[str] = mapped_column(String(100))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    outcome: Mapped[dict[str, Any]] = mapped_column(JSON)


class AcceptanceCurveRow(Base):
    """An acceptance curve imported for a registered pair (what a harness replays), kept by
    its digest so the same curve imported twice is one row."""

    __tablename__ = "acceptance_curves"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("pairs.id"), index=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    provenance: Mapped[dict[str, Any]] = mapped_column(JSON)
    curves: Mapped[dict[str, Any]] = mapped_column(JSON)
    imported_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
