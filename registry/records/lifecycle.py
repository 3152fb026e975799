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


class AcceptanceLengthRecord(BaseModel):
    k: int
    length: float = Field(description="Mean acceptance length (tokens per target call).")
    source: str = Field(description="plain, measured, or extrapolated beyond the measured k.")


class KRange(BaseModel):
    start_bs: int
    end_bs: int
    k: int = Field(description="Draft length in this range; 0: no speculation.")
    tokens_per_s: list[float] = Field(description="Predicted tokens/s at start_bs and end_bs.")
    plain_tokens_per_s: list[float]
    fixed_k_tokens_per_s: list[float] = Field(description="With the pair's own k throughout.")
    gain_over_fixed_k: list[float] = Field(description="tokens_per_s / fixed_k_tokens_per_s.")


class KSchedule(BaseModel):
    pair_digest: str
    method: str
    fixed_k: int
    hardware: str
    context: int
    dtype: str
    measurement_id: int
    category: str | None = None
    max_batch: int
    acceptance: list[AcceptanceLengthRecord]
    ranges: list[KRange]
    mean_gain_over_fixed_k: float = Field(
        description="Mean over batch sizes 1..max_batch of scheduled / fixed-k tokens/s."
    )
    mean_gain_over_plain: float
    vllm: dict[str, Any] = Field(
        description="speculative_config keys: num_speculative_tokens and "
        "num_speculative_tokens_per_batch_size [[start_bs, end_bs, k], ...]."
    )
    trtllm: dict[str, Any] = Field(
        description="speculative_config draft_len_schedule {batch_size: k} (PyTorch backend)."
    )
    sglang: dict[str, Any] | None = Field(
        default=None, description="None: SGLang has no per-batch-size draft length setting."
    )
    notes: list[str] = Field(default_factory=list)


class CurvePoint(BaseModel):
    k: int = Field(ge=1, le=16)
    acceptance_length: float = Field(
        description="Mean tokens per target call with k drafted (bonus token included)."
    )
    source: str = Field(description="measured, or extrapolated beyond the measured k.")
    synthetic_acceptance_rates: list[float] = Field(
        description="vLLM's synthetic rejection sampler input for k: entry i is the "
        "probability that the first i+1 draft tokens are all accepted."
    )


class CurveProvenance(BaseModel):
    pair_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    suite_name: str
    suite_digest: str = Field(min_length=1, max_length=128)
    engine: str = Field(description="What measured it: the pairreg runner or a serving engine.")
    engine_version: str
    sampling: dict[str, Any] = Field(
        description="The measurement settings (temperature, seed, acceptance rule, k, ...)."
    )
    settings_digest: str
    measured_k: int = Field(ge=1, le=64)
    measurement_id: int | None = Field(
        default=None, description="The measurement in the registry that exported it."
    )


class AcceptanceCurve(BaseModel):
    """Acceptance length per k (1..8) per category with where it came from, in the shape a
    benchmark harness replays through vLLM's synthetic rejection sampler."""

    format: str = Field(default="pairreg-acceptance-curve/1")
    provenance: CurveProvenance
    curves: dict[str, list[CurvePoint]] = Field(
        description="Per category (and 'overall'): one point per k."
    )
    vllm_replay: dict[str, Any] = Field(
        default_factory=dict,
        description="speculative_config keys that replay the overall curve at the measured k.",
    )


class CurveImportResult(BaseModel):
    id: int
    pair_digest: str
    digest: str = Field(description="SHA-256 of the curve's canonical JSON.")
    created: bool
