"""lifecycle: outgoing webhooks and outbox, incoming MLflow webhooks, acceptance curves

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 15:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from registry.tables.base import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("url", sa.String(length=2000), nullable=False),
        sa.Column("secret", sa.String(length=200), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("deployment", sa.String(length=100), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("lease_owner", sa.String(length=100), nullable=True),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_subscriptions")),
        sa.UniqueConstraint("name", name=op.f("uq_webhook_subscriptions_name")),
    )
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("audit_seq", sa.Integer(), nullable=False),
        sa.Column("deployments", sa.JSON(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_events")),
        sa.UniqueConstraint("audit_seq", name=op.f("uq_webhook_events_audit_seq")),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("subscription_id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["webhook_events.id"],
            name=op.f("fk_webhook_deliveries_event_id_webhook_events"),
        ),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["webhook_subscriptions.id"],
            name=op.f("fk_webhook_deliveries_subscription_id_webhook_subscriptions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["subscription_id", "state", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_webhook_deliveries_event_id"), "webhook_deliveries", ["event_id"], unique=False
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("attempted_at", UTCDateTime(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("dispatcher", sa.String(length=100), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["webhook_deliveries.id"],
            name=op.f("fk_webhook_attempts_delivery_id_webhook_deliveries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
    )
    op.create_index(
        op.f("ix_webhook_attempts_delivery_id"), "webhook_attempts", ["delivery_id"], unique=False
    )
    op.create_table(
        "mlflow_sources",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("registered_model", sa.String(length=500), nullable=False),
        sa.Column("lineage", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("aliases", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mlflow_sources")),
        sa.UniqueConstraint("registered_model", name=op.f("uq_mlflow_sources_registered_model")),
    )
    op.create_table(
        "mlflow_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.String(length=200), nullable=False),
        sa.Column("event", sa.String(length=100), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("outcome", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mlflow_deliveries")),
        sa.UniqueConstraint("delivery_id", name=op.f("uq_mlflow_deliveries_delivery_id")),
    )
    op.create_table(
        "acceptance_curves",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.Column("curves", sa.JSON(), nullable=False),
        sa.Column("imported_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pair_id"], ["pairs.id"], name=op.f("fk_acceptance_curves_pair_id_pairs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_acceptance_curves")),
        sa.UniqueConstraint("digest", name=op.f("uq_acceptance_curves_digest")),
    )
    op.create_index(
        op.f("ix_acceptance_curves_pair_id"), "acceptance_curves", ["pair_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_acceptance_curves_pair_id"), table_name="acceptance_curves")
    op.drop_table("acceptance_curves")
    op.drop_table("mlflow_deliveries")
    op.drop_table("mlflow_sources")
    op.drop_index(op.f("ix_webhook_attempts_delivery_id"), table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index(op.f("ix_webhook_deliveries_event_id"), table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_due", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_events")
    op.drop_table("webhook_subscriptions")
