"""separation of duties: measurement provenance, remote-code approvals, worker keys

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 15:45:00.000000

* ``measurements.produced_via`` (``job``, ``local`` or ``http``) and ``measurements.signature``
  (a worker's Ed25519 signature over its result's canonical statement). Existing rows are
  classified from what they already record: a job id means ``job``; an actor ``token:<name>``
  means a self-report over HTTP; anything else was the embedded registry's own user.
* ``remote_code_approvals``: an admin's approval of one artifact's model code, by manifest
  digest (it replaces policies' ``[runner] trust_remote_code`` lineage names).
* ``jobs.isolated``: a job that runs approved remote code, claimed only by a worker that
  holds nothing but its token.
* ``worker_keys``: Ed25519 public keys of workers, registered by an admin.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from registry.tables.base import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(
            sa.Column("produced_via", sa.String(16), nullable=False, server_default="http")
        )
        batch.add_column(sa.Column("signature", sa.JSON(), nullable=True))
    op.execute(
        "UPDATE measurements SET produced_via = CASE "
        "WHEN job_id IS NOT NULL THEN 'job' "
        "WHEN created_by LIKE 'token:%' THEN 'http' "
        "ELSE 'local' END"
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("isolated", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_table(
        "remote_code_approvals",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("manifest_digest", sa.String(64), nullable=False, unique=True),
        sa.Column("artifact_id", sa.Integer(), sa.ForeignKey("artifacts.id"), nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("approved_by", sa.String(200), nullable=False),
        sa.Column("approved_at", UTCDateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "worker_keys",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("fingerprint", sa.String(71), nullable=False, unique=True),
        sa.Column("token_name", sa.String(100), nullable=False, index=True),
        sa.Column("public_key", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", UTCDateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("worker_keys")
    op.drop_table("remote_code_approvals")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("isolated")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("signature")
        batch.drop_column("produced_via")
