"""request ids namespaced by the ingesting source

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 15:45:00.000000

A client's request id is unique only within its source (the ingesting token, or the local
user of an embedded registry): ``request_ids.request_id`` (and ``request_tags.request_id``)
now hold the stored key ``<source>/<client id>``, so one client can no longer claim, or
clash with, another client's id. ``request_ids`` gains:

* ``source``: who ingested the tag (``''`` for tags stored before this revision, whose key
  is the client's id itself);
* ``client_request_id``: the id the client sent (NULL for those older tags, where it is the
  key), indexed, so audits still look a request up by the id its client knows.

The key columns widen to 400 characters (a source of up to 120 and a client id of up to
200, plus the separator). On SQLite, batch mode recreates ``request_ids`` and
``request_tags`` to change the type, which drops their triggers: this migration drops the
batch guards that read ``request_ids`` first and recreates them, and revision 0005's
retention triggers, afterwards (as revision 0008 does).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_KEYED = ("request_ids", "request_tags")


def _sqlite_triggers(bind: sa.engine.Connection) -> None:
    """Revision 0005's retention triggers and revision 0008's batch guards (SQLite)."""
    run = lambda sql: bind.execute(sa.text(sql))  # noqa: E731
    for table, what in (("request_tags", "request tag"), ("request_ids", "request id")):
        run(f"DROP TRIGGER IF EXISTS {table}_retention")
        run(
            f"CREATE TRIGGER {table}_retention BEFORE DELETE ON {table} "
            "WHEN OLD.served_at > datetime('now', '-' || max(6, coalesce((SELECT months "
            "FROM retention_policies WHERE kind = 'request_tags'), 6)) || ' months') "
            f"BEGIN SELECT RAISE(ABORT, '{what} within its retention period: delete "
            "refused'); END"
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


def _drop_sqlite_guards(bind: sa.engine.Connection) -> None:
    for name in ("request_batches_referenced", "request_batches_id_fixed"):
        bind.execute(sa.text(f"DROP TRIGGER IF EXISTS {name}"))


def _key_length(bind: sa.engine.Connection, old: int, new: int) -> None:
    sqlite = bind.dialect.name == "sqlite"
    if sqlite:
        _drop_sqlite_guards(bind)
    for table in _KEYED:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column(
                "request_id",
                existing_type=sa.String(length=old),
                type_=sa.String(length=new),
                existing_nullable=False,
            )
    if sqlite:
        _sqlite_triggers(bind)


def upgrade() -> None:
    bind = op.get_bind()
    _key_length(bind, 200, 400)
    op.add_column(
        "request_ids",
        sa.Column("source", sa.String(length=120), nullable=False, server_default=""),
    )
    op.add_column(
        "request_ids", sa.Column("client_request_id", sa.String(length=200), nullable=True)
    )
    op.create_index("ix_request_ids_client", "request_ids", ["client_request_id"])


def downgrade() -> None:
    bind = op.get_bind()
    op.drop_index("ix_request_ids_client", table_name="request_ids")
    if bind.dialect.name == "sqlite":
        _drop_sqlite_guards(bind)  # recreated by _key_length, after both rebuilds
    with op.batch_alter_table("request_ids", schema=None) as batch_op:
        batch_op.drop_column("client_request_id")
        batch_op.drop_column("source")
    _key_length(bind, 400, 200)
