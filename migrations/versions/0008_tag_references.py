"""request tags: references checked once per batch, referenced rows permanent

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 23:40:00.000000

The per-row foreign keys ``request_tags.deployment_id -> deployments``,
``request_tags.pair_id -> pairs`` and ``request_ids.batch_id -> request_batches`` are
replaced (they cost half of PostgreSQL's work per ingest batch: three lookups and a row lock
for every tag). Integrity stays whole:

* every id ingest writes comes from the same transaction: deployments and pairs are looked
  up by name and digest (unknown: 422) and the batch row is inserted by the same statement
  as its ids (``registry.requests.store``), and nothing else writes these two tables;
* the rows those ids name can never disappear or change id, which the database enforces:
  ``pairs`` and ``deployments`` refuse ``DELETE`` (nothing in pairreg deletes them: a pair is
  retired, not deleted), ``request_batches`` refuses to delete a batch while ``request_ids``
  rows name it, all three refuse to change ``id``, and on PostgreSQL refuse ``TRUNCATE``.

SQLite's batch mode recreates a table to alter it, which drops its triggers: this migration
recreates the retention triggers of ``request_tags`` and ``request_ids`` (revision 0005), and
a later migration that alters ``pairs``, ``deployments`` or ``request_batches`` on SQLite
must recreate the guards here (``create_guards``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_FKS = (
    ("request_tags", "deployment_id", "deployments"),
    ("request_tags", "pair_id", "pairs"),
    ("request_ids", "batch_id", "request_batches"),
)
_PERMANENT = ("pairs", "deployments")

_PG_PERMANENT = """
CREATE OR REPLACE FUNCTION pairreg_permanent() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NEW.id IS DISTINCT FROM OLD.id THEN
            RAISE EXCEPTION '% %: request tags refer to this id (id change refused)',
                TG_TABLE_NAME, OLD.id;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% rows are permanent: request tags refer to them (% refused)',
        TG_TABLE_NAME, TG_OP;
END;
$$ LANGUAGE plpgsql
"""

_PG_BATCH_GUARD = """
CREATE OR REPLACE FUNCTION pairreg_batch_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'request_batches: request ids refer to them (TRUNCATE refused)';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.id IS NOT DISTINCT FROM OLD.id THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM request_ids WHERE batch_id = OLD.id) THEN
        RAISE EXCEPTION 'request batch %: request ids refer to it (% refused)', OLD.id, TG_OP;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""


def create_guards(bind: sa.engine.Connection) -> None:
    """The triggers that keep referenced rows in place (both dialects)."""
    run = lambda sql: bind.execute(sa.text(sql))  # noqa: E731
    if bind.dialect.name == "postgresql":
        run(_PG_PERMANENT)
        run(_PG_BATCH_GUARD)
        for table in _PERMANENT:
            run(
                f"CREATE TRIGGER {table}_permanent BEFORE DELETE OR UPDATE OF id ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION pairreg_permanent()"
            )
            run(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION pairreg_permanent()"
            )
        run(
            "CREATE TRIGGER request_batches_referenced BEFORE DELETE OR UPDATE OF id "
            "ON request_batches FOR EACH ROW EXECUTE FUNCTION pairreg_batch_guard()"
        )
        run(
            "CREATE TRIGGER request_batches_no_truncate BEFORE TRUNCATE ON request_batches "
            "FOR EACH STATEMENT EXECUTE FUNCTION pairreg_batch_guard()"
        )
        return
    for table in _PERMANENT:
        run(
            f"CREATE TRIGGER {table}_permanent BEFORE DELETE ON {table} BEGIN SELECT "
            f"RAISE(ABORT, '{table} rows are permanent: request tags refer to them "
            "(delete refused)'); END"
        )
        run(
            f"CREATE TRIGGER {table}_id_fixed BEFORE UPDATE OF id ON {table} "
            f"WHEN NEW.id IS NOT OLD.id BEGIN SELECT RAISE(ABORT, '{table}: request tags "
            "refer to this id (id change refused)'); END"
        )
    run(
        "CREATE TRIGGER request_batches_referenced BEFORE DELETE ON request_batches "
        "WHEN EXISTS (SELECT 1 FROM request_ids WHERE batch_id = OLD.id) BEGIN SELECT "
        "RAISE(ABORT, 'request batch: request ids refer to it (delete refused)'); END"
    )
    run(
        "CREATE TRIGGER request_batches_id_fixed BEFORE UPDATE OF id ON request_batches "
        "WHEN NEW.id IS NOT OLD.id AND EXISTS (SELECT 1 FROM request_ids "
        "WHERE batch_id = OLD.id) BEGIN SELECT RAISE(ABORT, 'request batch: request ids "
        "refer to it (id change refused)'); END"
    )


def drop_guards(bind: sa.engine.Connection) -> None:
    pg = bind.dialect.name == "postgresql"
    names = [(t, f"{t}_permanent") for t in _PERMANENT]
    names += [("request_batches", "request_batches_referenced")]
    if pg:
        names += [(t, f"{t}_no_truncate") for t in (*_PERMANENT, "request_batches")]
    else:
        names += [(t, f"{t}_id_fixed") for t in (*_PERMANENT, "request_batches")]
    for table, name in names:
        bind.execute(sa.text(f"DROP TRIGGER IF EXISTS {name}" + (f" ON {table}" if pg else "")))
    if pg:
        bind.execute(sa.text("DROP FUNCTION IF EXISTS pairreg_permanent()"))
        bind.execute(sa.text("DROP FUNCTION IF EXISTS pairreg_batch_guard()"))


def _sqlite_retention_triggers(bind: sa.engine.Connection) -> None:
    """Revision 0005's retention triggers (batch mode dropped them with the old tables)."""
    for table, what in (("request_tags", "request tag"), ("request_ids", "request id")):
        bind.execute(sa.text(f"DROP TRIGGER IF EXISTS {table}_retention"))
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
    bind = op.get_bind()
    for table, column, referred in _FKS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f"fk_{table}_{column}_{referred}", type_="foreignkey")
    if bind.dialect.name == "sqlite":
        _sqlite_retention_triggers(bind)
    create_guards(bind)


def downgrade() -> None:
    bind = op.get_bind()
    drop_guards(bind)
    for table, column, referred in _FKS:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.create_foreign_key(
                f"fk_{table}_{column}_{referred}", referred, [column], ["id"]
            )
    if bind.dialect.name == "sqlite":
        _sqlite_retention_triggers(bind)
