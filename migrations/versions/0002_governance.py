"""governance tables

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 13:08:00.639090

Policies (versioned by digest), measurements, validations, deployments with their event
history, the job queue and drift flags. One live pair per deployment is the single column
``deployments.current_pair_id`` moved by compare-and-set on ``deployments.version``, with
``UNIQUE (deployment_id, seq)`` on the events as the backstop against racing promoters.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import registry.tables.base

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("device", sa.String(length=16), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column(
            "lease_expires_at", registry.tables.base.UTCDateTime(timezone=True), nullable=True
        ),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("finished_at", registry.tables.base.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_jobs_idempotency_key")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_state_id", ["state", "id"], unique=False)

    op.create_table(
        "policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("toml_text", sa.Text(), nullable=False),
        sa.Column("parsed", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policies")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_policies_name_version")),
    )
    with op.batch_alter_table("policies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_policies_name"), ["name"], unique=False)

    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("policy_name", sa.String(length=100), nullable=False),
        sa.Column("current_pair_id", sa.Integer(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["current_pair_id"], ["pairs.id"], name=op.f("fk_deployments_current_pair_id_pairs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
        sa.UniqueConstraint("name", name=op.f("uq_deployments_name")),
    )
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_deployments_current_pair_id"), ["current_pair_id"], unique=False
        )

    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.Integer(), nullable=False),
        sa.Column("suite_name", sa.String(length=200), nullable=False),
        sa.Column("suite_digest", sa.String(length=64), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("settings_digest", sa.String(length=64), nullable=False),
        sa.Column("runner_version", sa.String(length=64), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=True),
        sa.Column("hardware", sa.JSON(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("alpha", sa.Float(), nullable=True),
        sa.Column("overall", sa.JSON(), nullable=False),
        sa.Column("categories", sa.JSON(), nullable=False),
        sa.Column("prompts", sa.JSON(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_measurements_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.id"], name=op.f("fk_measurements_pair_id_pairs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurements")),
        sa.UniqueConstraint("job_id", name=op.f("uq_measurements_job_id")),
    )
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_measurements_pair_id"), ["pair_id"], unique=False)
        batch_op.create_index(
            "ix_measurements_reuse",
            ["pair_id", "suite_digest", "settings_digest", "runner_version"],
            unique=False,
        )

    op.create_table(
        "drift_flags",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("pair_id", sa.Integer(), nullable=True),
        sa.Column("artifact_id", sa.Integer(), nullable=True),
        sa.Column("baseline_pair_id", sa.Integer(), nullable=True),
        sa.Column("baseline_measurement_id", sa.Integer(), nullable=True),
        sa.Column("candidate_measurement_id", sa.Integer(), nullable=True),
        sa.Column("policy_name", sa.String(length=100), nullable=True),
        sa.Column("effects", sa.JSON(), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("opened_by", sa.String(length=200), nullable=False),
        sa.Column("opened_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("closed_by", sa.String(length=200), nullable=True),
        sa.Column("closed_at", registry.tables.base.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["artifact_id"], ["artifacts.id"], name=op.f("fk_drift_flags_artifact_id_artifacts")
        ),
        sa.ForeignKeyConstraint(
            ["baseline_measurement_id"],
            ["measurements.id"],
            name=op.f("fk_drift_flags_baseline_measurement_id_measurements"),
        ),
        sa.ForeignKeyConstraint(
            ["baseline_pair_id"], ["pairs.id"], name=op.f("fk_drift_flags_baseline_pair_id_pairs")
        ),
        sa.ForeignKeyConstraint(
            ["candidate_measurement_id"],
            ["measurements.id"],
            name=op.f("fk_drift_flags_candidate_measurement_id_measurements"),
        ),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.id"], name=op.f("fk_drift_flags_pair_id_pairs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drift_flags")),
    )
    with op.batch_alter_table("drift_flags", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_drift_flags_artifact_id"), ["artifact_id"], unique=False
        )
        batch_op.create_index("ix_drift_flags_pair_state", ["pair_id", "state"], unique=False)

    op.create_table(
        "validations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.Integer(), nullable=False),
        sa.Column("policy_id", sa.Integer(), nullable=False),
        sa.Column("policy_name", sa.String(length=100), nullable=False),
        sa.Column("policy_digest", sa.String(length=64), nullable=False),
        sa.Column("measurement_id", sa.Integer(), nullable=True),
        sa.Column("deployment", sa.String(length=100), nullable=True),
        sa.Column("gates", sa.JSON(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("created_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["measurement_id"],
            ["measurements.id"],
            name=op.f("fk_validations_measurement_id_measurements"),
        ),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.id"], name=op.f("fk_validations_pair_id_pairs")
        ),
        sa.ForeignKeyConstraint(
            ["policy_id"], ["policies.id"], name=op.f("fk_validations_policy_id_policies")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_validations")),
    )
    with op.batch_alter_table("validations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_validations_pair_policy", ["pair_id", "policy_name"], unique=False
        )

    op.create_table(
        "deployment_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("from_pair_id", sa.Integer(), nullable=True),
        sa.Column("to_pair_id", sa.Integer(), nullable=True),
        sa.Column("validation_id", sa.Integer(), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_deployment_events_deployment_id_deployments"),
        ),
        sa.ForeignKeyConstraint(
            ["from_pair_id"], ["pairs.id"], name=op.f("fk_deployment_events_from_pair_id_pairs")
        ),
        sa.ForeignKeyConstraint(
            ["to_pair_id"], ["pairs.id"], name=op.f("fk_deployment_events_to_pair_id_pairs")
        ),
        sa.ForeignKeyConstraint(
            ["validation_id"],
            ["validations.id"],
            name=op.f("fk_deployment_events_validation_id_validations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_events")),
        sa.UniqueConstraint(
            "deployment_id", "seq", name=op.f("uq_deployment_events_deployment_id_seq")
        ),
    )
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_deployment_events_deployment_at", ["deployment_id", "at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.drop_index("ix_deployment_events_deployment_at")

    op.drop_table("deployment_events")
    with op.batch_alter_table("validations", schema=None) as batch_op:
        batch_op.drop_index("ix_validations_pair_policy")

    op.drop_table("validations")
    with op.batch_alter_table("drift_flags", schema=None) as batch_op:
        batch_op.drop_index("ix_drift_flags_pair_state")
        batch_op.drop_index(batch_op.f("ix_drift_flags_artifact_id"))

    op.drop_table("drift_flags")
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_index("ix_measurements_reuse")
        batch_op.drop_index(batch_op.f("ix_measurements_pair_id"))

    op.drop_table("measurements")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deployments_current_pair_id"))

    op.drop_table("deployments")
    with op.batch_alter_table("policies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_policies_name"))

    op.drop_table("policies")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_state_id")

    op.drop_table("jobs")
