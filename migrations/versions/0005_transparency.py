"""transparency log, signed checkpoints, retention, artifact signatures

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 00:40:00.000000

* ``audit_tree``: every perfect subtree of the RFC 6962 tree over the audit events,
  backfilled here from the existing events (registry.trust.audit_tree.rebuild).
* ``log_checkpoints``: the C2SP checkpoints the log signed.
* ``retention_policies``: months each kind of record must be kept (at least six), seeded
  for ``request_tags`` and ``audit_events``; a ``BEFORE DELETE`` trigger on ``request_tags``
  and ``request_ids`` refuses to delete a row younger than that, on both dialects.
* ``artifacts.signature`` / ``signature_bundle``: a verified OpenSSF model signature.

On PostgreSQL ``audit_tree`` and ``log_checkpoints`` are append-only like ``audit_events``.
SQLite's batch mode recreates a table to alter it, which drops its triggers: a later
migration that alters ``request_tags`` or ``request_ids`` on SQLite must recreate them
(``create_retention_triggers``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import registry.tables.base
from registry.trust import audit_tree

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

MIN_MONTHS = 6
_GUARDED = (("request_tags", "request tag"), ("request_ids", "request id"))

_PG_APPEND_ONLY = """
CREATE OR REPLACE FUNCTION pairreg_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP;
END;
$$ LANGUAGE plpgsql
"""

_PG_RETENTION = """
CREATE OR REPLACE FUNCTION pairreg_retention_guard() RETURNS trigger AS $$
DECLARE
    keep integer;
BEGIN
    SELECT months INTO keep FROM retention_policies WHERE kind = 'request_tags';
    keep := GREATEST(COALESCE(keep, 6), 6);
    IF OLD.served_at > now() - make_interval(months => keep) THEN
        RAISE EXCEPTION '% %: served at %, within the % month retention period (delete refused)',
            TG_TABLE_NAME, OLD.request_id, OLD.served_at, keep;
    END IF;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql
"""


def create_retention_triggers(bind: sa.engine.Connection) -> None:
    if bind.dialect.name == "postgresql":
        bind.execute(sa.text(_PG_RETENTION))
        for table, _ in _GUARDED:
            bind.execute(
                sa.text(
                    f"CREATE TRIGGER {table}_retention BEFORE DELETE ON {table} "
                    "FOR EACH ROW EXECUTE FUNCTION pairreg_retention_guard()"
                )
            )
        return
    for table, what in _GUARDED:
        bind.execute(
            sa.text(
                f"CREATE TRIGGER {table}_retention BEFORE DELETE ON {table} "
                "WHEN OLD.served_at > datetime('now', '-' || max(6, coalesce((SELECT months "
                "FROM retention_policies WHERE kind = 'request_tags'), 6)) || ' months') "
                f"BEGIN SELECT RAISE(ABORT, '{what} within its retention period: delete "
                "refused'); END"
            )
        )


def upgrade() -> None:
    op.create_table(
        "audit_tree",
        sa.Column("level", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("idx", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.LargeBinary(length=32), nullable=False),
        sa.PrimaryKeyConstraint("level", "idx", name=op.f("pk_audit_tree")),
    )
    op.create_table(
        "log_checkpoints",
        sa.Column("tree_size", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("root_hash", sa.String(length=64), nullable=False),
        sa.Column("origin", sa.String(length=200), nullable=False),
        sa.Column("key_id", sa.String(length=8), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("signed_by", sa.String(length=200), nullable=False),
        sa.Column("signed_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tree_size", name=op.f("pk_log_checkpoints")),
    )
    retention = op.create_table(
        "retention_policies",
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("months", sa.Integer(), nullable=False),
        sa.Column("updated_by", sa.String(length=200), nullable=False),
        sa.Column("updated_at", registry.tables.base.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_retention_policies")),
    )
    now = datetime.now(UTC)
    op.bulk_insert(
        retention,
        [
            {"kind": k, "months": MIN_MONTHS, "updated_by": "migration", "updated_at": now}
            for k in ("request_tags", "audit_events")
        ],
    )
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("signature", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("signature_bundle", sa.Text(), nullable=True))

    bind = op.get_bind()
    audit_tree.rebuild(bind)
    create_retention_triggers(bind)
    if bind.dialect.name == "postgresql":
        op.execute(_PG_APPEND_ONLY)
        for table in ("audit_tree", "log_checkpoints"):
            op.execute(
                f"CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION pairreg_append_only()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION pairreg_append_only()"
            )


def downgrade() -> None:
    bind = op.get_bind()
    for table, _ in _GUARDED:
        op.execute(
            f"DROP TRIGGER IF EXISTS {table}_retention"
            + (f" ON {table}" if bind.dialect.name == "postgresql" else "")
        )
    if bind.dialect.name == "postgresql":
        for table in ("audit_tree", "log_checkpoints"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update_delete ON {table}")
        op.execute("DROP FUNCTION IF EXISTS pairreg_append_only()")
        op.execute("DROP FUNCTION IF EXISTS pairreg_retention_guard()")
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_column("signature_bundle")
        batch_op.drop_column("signature")
    op.drop_table("retention_policies")
    op.drop_table("log_checkpoints")
    op.drop_table("audit_tree")
