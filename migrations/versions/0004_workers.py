"""workers: the runner version each measurement worker last claimed with

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import registry.tables.base

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("runner_version", sa.String(length=64), nullable=True),
        sa.Column("device", sa.String(length=16), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("first_seen_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workers")),
    )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workers_last_seen_at"), ["last_seen_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workers_last_seen_at"))
    op.drop_table("workers")
