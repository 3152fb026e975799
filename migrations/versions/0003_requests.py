"""request tags, idempotency index, ingest batches, telemetry

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 14:10:00.000000

On PostgreSQL ``request_tags`` is partitioned by month on ``served_at`` (partitions in the
``request_tag_partitions`` schema, plus a DEFAULT partition); its primary key includes the
partition key, so request-id uniqueness is enforced by the unpartitioned ``request_ids``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import registry.tables.base
from registry.requests import partitions as tag_partitions

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "request_batches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("audit_seq", sa.Integer(), nullable=True),
        sa.Column("merkle_root", sa.String(length=64), nullable=False),
        sa.Column("received_digest", sa.String(length=64), nullable=False),
        sa.Column("stored", sa.Integer(), nullable=False),
        sa.Column("duplicates", sa.Integer(), nullable=False),
        sa.Column("inconsistent", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("created_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_batches")),
    )
    op.create_table(
        "request_ids",
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("served_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("tag_digest", sa.String(length=64), nullable=False),
        sa.Column("batch_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["request_batches.id"],
            name=op.f("fk_request_ids_batch_id_request_batches"),
        ),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_request_ids")),
    )
    with op.batch_alter_table("request_ids", schema=None) as batch_op:
        batch_op.create_index("ix_request_ids_batch", ["batch_id", "request_id"], unique=False)

    op.create_table(
        "request_tags",
        sa.Column("request_id", sa.String(length=200), nullable=False),
        sa.Column("served_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=True),
        sa.Column("pair_filled", sa.Boolean(), nullable=False),
        sa.Column("consistent", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_request_tags_deployment_id_deployments"),
        ),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.id"], name=op.f("fk_request_tags_pair_id_pairs")
        ),
        sa.PrimaryKeyConstraint("request_id", "served_at", name=op.f("pk_request_tags")),
        postgresql_partition_by="RANGE (served_at)",
    )
    with op.batch_alter_table("request_tags", schema=None) as batch_op:
        batch_op.create_index(
            "ix_request_tags_deployment_served", ["deployment_id", "served_at"], unique=False
        )
        batch_op.create_index("ix_request_tags_pair_served", ["pair_id", "served_at"], unique=False)

    op.create_table(
        "telemetry_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=500), nullable=False),
        sa.Column("scraped_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("counters", sa.JSON(), nullable=False),
        sa.Column("deltas", sa.JSON(), nullable=False),
        sa.Column("reset", sa.Boolean(), nullable=False),
        sa.Column("drafted", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("online_acceptance", sa.Float(), nullable=True),
        sa.Column("baseline_acceptance", sa.Float(), nullable=True),
        sa.Column("drift_flag_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_telemetry_samples_deployment_id_deployments"),
        ),
        sa.ForeignKeyConstraint(
            ["drift_flag_id"],
            ["drift_flags.id"],
            name=op.f("fk_telemetry_samples_drift_flag_id_drift_flags"),
        ),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.id"], name=op.f("fk_telemetry_samples_pair_id_pairs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_telemetry_samples")),
    )
    with op.batch_alter_table("telemetry_samples", schema=None) as batch_op:
        batch_op.create_index(
            "ix_telemetry_samples_deployment_id", ["deployment_id", "id"], unique=False
        )

    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        tag_partitions.create_schema_and_default(bind)
        tag_partitions.ensure_months(bind, before=1, ahead=3)


def downgrade() -> None:
    with op.batch_alter_table("telemetry_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_telemetry_samples_deployment_id")
    op.drop_table("telemetry_samples")
    with op.batch_alter_table("request_tags", schema=None) as batch_op:
        batch_op.drop_index("ix_request_tags_pair_served")
        batch_op.drop_index("ix_request_tags_deployment_served")
    op.drop_table("request_tags")
    with op.batch_alter_table("request_ids", schema=None) as batch_op:
        batch_op.drop_index("ix_request_ids_batch")
    op.drop_table("request_ids")
    op.drop_table("request_batches")
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute(f"DROP SCHEMA IF EXISTS {tag_partitions.SCHEMA} CASCADE")
