"""online acceptance monitors and their five-minute buckets

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-01 04:10:00.000000

* ``online_monitors``: one anytime-valid test per (deployment, pair), with its resumable state.
* ``online_buckets``: served counters per monitor and five minutes of ``served_at``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import registry.tables.base

revision = "0007"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "online_monitors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.Integer(), nullable=False),
        sa.Column("validated_alpha", sa.Float(), nullable=True),
        sa.Column("reference", sa.Float(), nullable=True),
        sa.Column("level", sa.Float(), nullable=False),
        sa.Column("tolerance", sa.Float(), nullable=False),
        sa.Column("min_drafted", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("drop_test", sa.JSON(), nullable=False),
        sa.Column("recovery_test", sa.JSON(), nullable=True),
        sa.Column("flag_id", sa.Integer(), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("tested", sa.BigInteger(), nullable=False),
        sa.Column("drafted", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("rate_sum", sa.Float(), nullable=False),
        sa.Column("alarms", sa.Integer(), nullable=False),
        sa.Column("started_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("alarm_at", registry.tables.base.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_online_monitors_deployment_id_deployments"),
        ),
        sa.ForeignKeyConstraint(
            ["flag_id"], ["drift_flags.id"], name=op.f("fk_online_monitors_flag_id_drift_flags")
        ),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.id"], name=op.f("fk_online_monitors_pair_id_pairs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_online_monitors")),
        sa.UniqueConstraint("deployment_id", "pair_id", name="uq_online_monitor"),
    )
    op.create_table(
        "online_buckets",
        sa.Column("monitor_id", sa.Integer(), nullable=False),
        sa.Column("start", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("tested", sa.Integer(), nullable=False),
        sa.Column("drafted", sa.BigInteger(), nullable=False),
        sa.Column("accepted", sa.BigInteger(), nullable=False),
        sa.Column("rate_sum", sa.Float(), nullable=False),
        sa.Column("log_e", sa.Float(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["monitor_id"],
            ["online_monitors.id"],
            name=op.f("fk_online_buckets_monitor_id_online_monitors"),
        ),
        sa.PrimaryKeyConstraint("monitor_id", "start", name=op.f("pk_online_buckets")),
    )


def downgrade() -> None:
    op.drop_table("online_buckets")
    op.drop_table("online_monitors")
