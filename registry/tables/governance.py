"""Governance tables: policies, measurements, validations, deployments, jobs, drift flags.

"At most one live pair per deployment" is a property of the schema, not of the code that
writes it: the live pair is the single column ``deployments.current_pair_id``, every move
bumps ``deployments.version`` with a compare-and-set (``UPDATE … WHERE version = :seen``),
and every move appends a ``deployment_events`` row whose ``seq`` equals the new version
under ``UNIQUE (deployment_id, seq)``. Two promoters that read the same version cannot both
commit: the second's compare-and-set matches no row, and were it to get that far its event
row would collide on the unique key.
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
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from registry.tables.base import Base, UTCDateTime, utcnow


class Policy(Base):
    """One version of a named policy; a name's newest version is the one in force."""

    __tablename__ = "policies"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    version: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(String(64))
    toml_text: Mapped[str] = mapped_column(Text)
    parsed: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Measurement(Base):
    """Acceptance of one pair on one suite with one set of settings: raw counters + derived."""

    __tablename__ = "measurements"
    __table_args__ = (
        Index(
            "ix_measurements_reuse", "pair_id", "suite_digest", "settings_digest", "runner_version"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("pairs.id"), index=True)
    suite_name: Mapped[str] = mapped_column(String(200))
    suite_digest: Mapped[str] = mapped_column(String(64))
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    settings_digest: Mapped[str] = mapped_column(String(64))
    runner_version: Mapped[str] = mapped_column(String(64))
    device: Mapped[str | None] = mapped_column(String(64))
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int | None] = mapped_column(Integer)
    alpha: Mapped[float | None] = mapped_column(Float)
    overall: Mapped[dict[str, Any]] = mapped_column(JSON)
    categories: Mapped[dict[str, Any]] = mapped_column(JSON)
    prompts: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    extra: Mapped[dict[str, Any]] = mapped_column(JSON)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), unique=True)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # How it reached the registry (``job``: a worker under a job; ``local``: the embedded
    # registry's own user; ``http``: self-reported over HTTP): what a policy's [trust] reads.
    produced_via: Mapped[str] = mapped_column(String(16), default="http")
    # A worker's Ed25519 signature over the canonical statement of its result, when it
    # signed (registry/trust/measurement_signing.py): {statement, key, signature}.
    signature: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Validation(Base):
    """The gate results of one pair against one policy version, from one measurement."""

    __tablename__ = "validations"
    __table_args__ = (Index("ix_validations_pair_policy", "pair_id", "policy_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("pairs.id"))
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"))
    policy_name: Mapped[str] = mapped_column(String(100))
    policy_digest: Mapped[str] = mapped_column(String(64))
    measurement_id: Mapped[int | None] = mapped_column(ForeignKey("measurements.id"))
    deployment: Mapped[str | None] = mapped_column(String(100))
    gates: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    passed: Mapped[bool] = mapped_column(Boolean)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Deployment(Base):
    """A named alias that serves exactly one pair (or none yet); see the module docstring."""

    __tablename__ = "deployments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    policy_name: Mapped[str] = mapped_column(String(100))
    current_pair_id: Mapped[int | None] = mapped_column(ForeignKey("pairs.id"), index=True)
    version: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class DeploymentEvent(Base):
    """One move of a deployment; ``seq`` is the deployment version the move produced."""

    __tablename__ = "deployment_events"
    __table_args__ = (
        UniqueConstraint("deployment_id", "seq"),
        Index("ix_deployment_events_deployment_at", "deployment_id", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    seq: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))
    from_pair_id: Mapped[int | None] = mapped_column(ForeignKey("pairs.id"))
    to_pair_id: Mapped[int | None] = mapped_column(ForeignKey("pairs.id"))
    validation_id: Mapped[int | None] = mapped_column(ForeignKey("validations.id"))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Job(Base):
    """A unit of work for a worker, claimed under a lease that expires if the worker dies."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_state_id", "state", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    args: Mapped[dict[str, Any]] = mapped_column(JSON)
    idempotency_key: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16))
    device: Mapped[str | None] = mapped_column(String(16))
    # Runs an artifact's own model code (approved by manifest digest): only a worker that
    # holds nothing but its token (``claim_job(isolated=True)`` over HTTP) may claim it.
    isolated: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class Worker(Base):
    """A measurement worker as last seen claiming jobs: which runner version it measures
    with, so a validation reuses only measurements that worker would reproduce."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    runner_version: Mapped[str | None] = mapped_column(String(64))
    device: Mapped[str | None] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(200))
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)


class DriftFlag(Base):
    """A reason not to promote a pair: acceptance drift, changed files, or a workload shift."""

    __tablename__ = "drift_flags"
    __table_args__ = (Index("ix_drift_flags_pair_state", "pair_id", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    pair_id: Mapped[int | None] = mapped_column(ForeignKey("pairs.id"))
    artifact_id: Mapped[int | None] = mapped_column(ForeignKey("artifacts.id"), index=True)
    baseline_pair_id: Mapped[int | None] = mapped_column(ForeignKey("pairs.id"))
    baseline_measurement_id: Mapped[int | None] = mapped_column(ForeignKey("measurements.id"))
    candidate_measurement_id: Mapped[int | None] = mapped_column(ForeignKey("measurements.id"))
    policy_name: Mapped[str | None] = mapped_column(String(100))
    effects: Mapped[dict[str, Any]] = mapped_column(JSON)
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    summary: Mapped[str] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    opened_by: Mapped[str] = mapped_column(String(200))
    opened_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    closed_by: Mapped[str | None] = mapped_column(String(200))
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class RemoteCodeApproval(Base):
    """An admin's approval for one artifact's own model code (``auto_map``) to run: bound to
    the exact bytes (the manifest digest), never to a lineage name a policy could repeat."""

    __tablename__ = "remote_code_approvals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    manifest_digest: Mapped[str] = mapped_column(String(64), unique=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"))
    reason: Mapped[str] = mapped_column(String(500))
    approved_by: Mapped[str] = mapped_column(String(200))
    approved_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WorkerKey(Base):
    """An Ed25519 public key an admin registered for one worker token: results that token's
    worker signs with the private half verify offline against it."""

    __tablename__ = "worker_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(71), unique=True)  # sha256:<hex of raw key>
    token_name: Mapped[str] = mapped_column(String(100), index=True)
    public_key: Mapped[str] = mapped_column(String(64))  # the raw 32 bytes, hex
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
