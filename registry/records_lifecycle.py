"""Records of the lifecycle services: outgoing webhook subscriptions and their deliveries,
and the MLflow registry webhooks pairreg receives."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class WebhookRecord(BaseModel):
    id: int
    name: str
    url: str
    events: list[str] = Field(description="Event types sent; empty: every type.")
    deployment: str | None = Field(
        default=None, description="Only events that concern this deployment; None: all."
    )
    active: bool
    created_by: str
    created_at: datetime
    pending: int = Field(default=0, description="Deliveries not yet acknowledged with a 2xx.")
    delivered: int = 0


class WebhookCreated(BaseModel):
    webhook: WebhookRecord
    secret: str = Field(
        description="The Standard Webhooks signing secret (whsec_…); shown once, keep it with "
        "the receiver."
    )


class WebhookAttemptRecord(BaseModel):
    attempted_at: datetime
    status_code: int | None = None
    error: str | None = None
    duration_ms: float
    dispatcher: str


class WebhookDeliveryRecord(BaseModel):
    id: int
    webhook: str
    message_id: str = Field(description="The webhook-id header: the same on every attempt.")
    event_type: str
    audit_seq: int
    deployments: list[str]
    state: str = Field(description="pending or delivered.")
    attempts: int
    next_attempt_at: datetime | None = None
    last_status: int | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None
    payload: dict[str, Any]
    attempt_log: list[WebhookAttemptRecord] = Field(default_factory=list)


class MlflowSourceRecord(BaseModel):
    id: int
    registered_model: str = Field(description="The MLflow registered model's name.")
    lineage: str = Field(description="The pairreg lineage its versions join.")
    role: str
    aliases: list[str] = Field(
        description="Aliases whose moves register the version; empty: every new version."
    )
    created_by: str
    created_at: datetime


class MlflowDeliveryRecord(BaseModel):
    delivery_id: str
    event: str
    received_at: datetime
    outcome: dict[str, Any] = Field(
        description="action (registered, unchanged, ignored), lineage, artifact and version, "
        "the MLflow model version, and whether the target changed."
    )
