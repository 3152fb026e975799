"""Records the governance services return: policies, measurements, gates, deployments,
jobs and drift flags. The API serialises them and the remote client parses them back, so
embedded and remote commands render the same.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

JobState = Literal["queued", "running", "done", "failed"]
FlagKind = Literal["drift", "integrity", "workload", "serving"]
FlagState = Literal["open", "acknowledged", "resolved"]
Severity = Literal["low", "medium", "high"]


class PolicyRecord(BaseModel):
    id: int
    name: str
    version: int = Field(description="1 for the first stored text of this name, +1 per change.")
    digest: str = Field(description="SHA-256 of the canonical JSON of the parsed policy.")
    toml_text: str
    parsed: dict[str, Any]
    created_by: str
    created_at: datetime


class PolicyPutResult(BaseModel):
    policy: PolicyRecord
    created: bool = Field(description="False when this exact policy was already stored.")


class MeasurementRecord(BaseModel):
    id: int
    pair_id: int
    pair_digest: str
    suite_name: str
    suite_digest: str
    settings: dict[str, Any]
    settings_digest: str
    runner_version: str
    device: str | None = None
    hardware: dict[str, Any]
    seed: int | None = None
    alpha: float | None = Field(default=None, description="Overall α over every prompt.")
    overall: dict[str, Any]
    categories: dict[str, Any] = Field(
        description="Per category: alpha, alpha_ci, draft_acceptance_rate, tau, expected_alpha, "
        "per_position, prompts, counters."
    )
    prompts: list[dict[str, Any]] | None = Field(
        default=None, description="Per-prompt raw counters; omitted in lists."
    )
    extra: dict[str, Any] = Field(default_factory=dict)
    mlflow_run_id: str | None = None
    job_id: int | None = None
    created_by: str
    created_at: datetime
    produced_via: str = Field(
        default="http",
        description="How it was produced: job (a worker under a job), local (the embedded "
        "registry's own user) or http (self-reported over HTTP).",
    )
    signature: dict[str, Any] | None = Field(
        default=None,
        description="A worker's Ed25519 signature over the result's canonical statement "
        "({statement, key, signature}); verify offline with the worker's public key.",
    )


class GateResult(BaseModel):
    name: str
    required: str
    measured: str
    passed: bool
    detail: str | None = None


class ValidationRecord(BaseModel):
    id: int
    pair_id: int
    pair_digest: str
    policy_name: str
    policy_digest: str
    measurement_id: int | None
    deployment: str | None = None
    gates: list[GateResult]
    passed: bool
    mlflow_run_id: str | None = None
    actor: str
    created_at: datetime


class JobRecord(BaseModel):
    id: int
    kind: str
    args: dict[str, Any]
    idempotency_key: str
    state: JobState
    device: str | None = None
    isolated: bool = Field(
        default=False,
        description="Runs approved remote model code: only isolated workers claim it.",
    )
    attempts: int
    max_attempts: int
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    created_by: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class ValidateResult(BaseModel):
    """Either the finished validation, or the measurement job it waits for."""

    state: Literal["done", "queued"]
    validation: ValidationRecord | None = None
    job: JobRecord | None = None
    pair_status: str


class DeploymentEventRecord(BaseModel):
    seq: int
    action: Literal["promote", "rollback"]
    from_pair_id: int | None = None
    from_pair_digest: str | None = None
    to_pair_id: int | None = None
    to_pair_digest: str | None = None
    validation_id: int | None = None
    actor: str
    reason: str
    at: datetime


class DeploymentRecord(BaseModel):
    id: int
    name: str
    policy_name: str
    current_pair_id: int | None = None
    current_pair_digest: str | None = None
    version: int = Field(description="Number of moves so far; pass as expect_version to CAS.")
    created_by: str
    created_at: datetime
    updated_at: datetime
    history: list[DeploymentEventRecord] | None = Field(
        default=None, description="Every move, oldest first; present on single reads."
    )


class PromoteResult(BaseModel):
    deployment: DeploymentRecord
    event: DeploymentEventRecord
    gates: list[GateResult] = Field(default_factory=list)


class DriftFlagRecord(BaseModel):
    id: int
    kind: FlagKind
    pair_id: int | None = None
    pair_digest: str | None = None
    artifact_id: int | None = None
    baseline_pair_id: int | None = None
    baseline_measurement_id: int | None = None
    candidate_measurement_id: int | None = None
    policy_name: str | None = None
    effects: dict[str, Any] = Field(
        description="Per category: baseline/candidate α, mean paired difference, CI, p-value, "
        "Holm-adjusted p-value, significant, drop_exceeds_margin; plus teacher-forced overlaps."
    )
    severity: Severity
    state: FlagState
    summary: str
    reason: str | None = None
    opened_by: str
    opened_at: datetime
    closed_by: str | None = None
    closed_at: datetime | None = None


class DriftCheckResult(BaseModel):
    """The comparison of a candidate's measurement with its baseline's (flag or clean)."""

    candidate_pair_id: int
    baseline_pair_id: int
    baseline_measurement_id: int
    candidate_measurement_id: int
    effects: dict[str, Any]
    flagged: bool
    flag: DriftFlagRecord | None = None


class WatchResult(BaseModel):
    lineage: str
    source: str
    previous_commit: str | None = None
    current_commit: str | None = None
    registered: bool
    artifact_id: int | None = None
    error: str | None = None


class RemoteCodeApprovalRecord(BaseModel):
    """An admin's approval of one artifact's own model code, bound to its exact bytes."""

    id: int
    manifest_digest: str
    artifact_id: int
    reason: str
    approved_by: str
    approved_at: datetime
    created: bool = Field(default=True, description="False when the bytes were approved before.")


class WorkerKeyRecord(BaseModel):
    """A worker's Ed25519 public key (hex of the raw 32 bytes) and the token it signs for."""

    id: int
    fingerprint: str
    token_name: str
    public_key: str
    created_by: str
    created_at: datetime
    revoked_at: datetime | None = None


class MeasurementVerification(BaseModel):
    """Whether a measurement's stored signature verifies against its worker's key."""

    measurement_id: int
    produced_via: str
    signed: bool
    key: str | None = None
    token_name: str | None = None
    ok: bool
    problems: list[str]
