"""audit log append-only on SQLite as on PostgreSQL

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-03 15:40:00.000000

PostgreSQL has refused ``UPDATE``, ``DELETE`` and ``TRUNCATE`` on ``audit_events``
(revision 0001), ``audit_tree`` and ``log_checkpoints`` (revision 0005) from the start; the
embedded SQLite database had no such guard, so any code path (or a stray ``sqlite3`` session
through the registry's own connection) could edit the log. This revision adds ``BEFORE
UPDATE`` and ``BEFORE DELETE`` triggers on the same three tables on SQLite, raising the same
"append-only" message.

A trigger does not stop someone holding the database file (they can drop it): that attack is
what verification against the signed checkpoints catches (docs/transparency.md).

SQLite's batch mode recreates a table to alter it, which drops its triggers: a later migration
that alters one of these tables on SQLite must call ``create_sqlite_triggers`` again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0008"
branch_labels = None
depends_on = None

APPEND_ONLY_TABLES = ("audit_events", "audit_tree", "log_checkpoints")


def create_sqlite_triggers(bind: sa.engine.Connection) -> None:
    for table in APPEND_ONLY_TABLES:
        for verb in ("UPDATE", "DELETE"):
            name = f"{table}_no_{verb.lower()}"
            bind.execute(sa.text(f"DROP TRIGGER IF EXISTS {name}"))
            bind.execute(
                sa.text(
                    f"CREATE TRIGGER {name} BEFORE {verb} ON {table} BEGIN SELECT "
                    f"RAISE(ABORT, '{table} is append-only ({verb} refused)'); END"
                )
            )


def drop_sqlite_triggers(bind: sa.engine.Connection) -> None:
    for table in APPEND_ONLY_TABLES:
        for verb in ("update", "delete"):
            bind.execute(sa.text(f"DROP TRIGGER IF EXISTS {table}_no_{verb}"))


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        create_sqlite_triggers(bind)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        drop_sqlite_triggers(bind)
