"""one audit log: the Merkle log only, append-only on SQLite as on PostgreSQL

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 15:40:00.000000

* **The hash chain is retired.** ``audit_events.prev_hash`` and ``chain_hash`` are dropped:
  the RFC 6962 Merkle tree over the same events (``audit_tree``, revision 0005) and its
  signed C2SP checkpoints are the one log. The events stay where they are (nothing is
  copied); before anything is dropped, the chain is recomputed over every event and the
  stored tree is recomputed from the events, and the migration refuses, naming the first
  bad sequence number, if either does not hold: the last moment the chain can vouch for the
  events is the moment it is retired. ``downgrade`` recomputes the chain from the events.
* **Append-only on SQLite.** PostgreSQL has refused ``UPDATE``, ``DELETE`` and ``TRUNCATE``
  on ``audit_events`` (revision 0001), ``audit_tree`` and ``log_checkpoints`` (0005) from
  the start; SQLite had no guard. ``BEFORE UPDATE`` and ``BEFORE DELETE`` triggers on the
  same three tables now raise the same "append-only" message. A trigger does not stop
  someone holding the database file (they can drop it): that is what verification against
  the signed checkpoints catches (docs/transparency.md).

SQLite's batch mode recreates a table to alter it, which drops its triggers: a later
migration that alters one of these tables on SQLite must call ``create_sqlite_triggers``.
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from alembic import op

from registry.canonical import canonical_json
from registry.tables.base import UTCDateTime
from registry.trust import audit_tree

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

APPEND_ONLY_TABLES = ("audit_events", "audit_tree", "log_checkpoints")
GENESIS_HASH = "0" * 64
_BATCH = 5000


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


EVENTS = sa.table(
    "audit_events",
    sa.column("seq", sa.Integer()),
    sa.column("occurred_at", UTCDateTime()),
    *(sa.column(c, sa.String()) for c in ("actor", "action", "entity_type", "entity_id")),
    sa.column("payload", sa.Text()),
    sa.column("prev_hash", sa.String()),
    sa.column("chain_hash", sa.String()),
)


def _chain_rows(bind: sa.engine.Connection, with_hashes: bool):  # type: ignore[no-untyped-def]
    """Events in sequence order, streamed in batches, with their chain-hash body."""
    names = ["seq", "occurred_at", "actor", "action", "entity_type", "entity_id", "payload"]
    if with_hashes:
        names += ["prev_hash", "chain_hash"]
    cols = [EVENTS.c[n] for n in names]
    last = 0
    while True:
        rows = bind.execute(
            sa.select(*cols).where(EVENTS.c.seq > last).order_by(EVENTS.c.seq).limit(_BATCH)
        ).all()
        if not rows:
            return
        for row in rows:
            yield row, audit_tree._body_of_row(row)
        last = rows[-1].seq


def _step(prev: str, body: dict) -> str:  # type: ignore[type-arg]
    return hashlib.sha256(bytes.fromhex(prev) + canonical_json(body)).hexdigest()


def verify_chain_before_retiring(bind: sa.engine.Connection) -> int:
    """Recompute the chain over every event; raise naming the first broken sequence."""
    prev, expected = GENESIS_HASH, 1
    for row, body in _chain_rows(bind, with_hashes=True):
        if row.seq != expected:
            raise RuntimeError(f"audit chain: sequence gap at {expected} (found {row.seq})")
        if row.prev_hash != prev or _step(prev, body) != row.chain_hash:
            raise RuntimeError(
                f"audit chain broken at sequence {row.seq}: refusing to retire the chain "
                "over an altered log (restore the database from a backup first)"
            )
        prev, expected = row.chain_hash, expected + 1
    return expected - 1


def upgrade() -> None:
    bind = op.get_bind()
    count = verify_chain_before_retiring(bind)
    report = audit_tree.verify_tree(bind)
    if not report.ok or report.size != count:
        raise RuntimeError(
            f"audit tree does not match the events at sequence {report.first_bad_seq}: "
            f"{report.reason or f'{report.size} leaves for {count} events'}; refusing to "
            "retire the chain"
        )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_column("chain_hash")
        batch_op.drop_column("prev_hash")
    if bind.dialect.name == "sqlite":
        create_sqlite_triggers(bind)


def downgrade() -> None:
    bind = op.get_bind()
    pg = bind.dialect.name == "postgresql"
    if not pg:
        drop_sqlite_triggers(bind)
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("prev_hash", sa.String(length=64), nullable=False, server_default="")
        )
        batch_op.add_column(
            sa.Column("chain_hash", sa.String(length=64), nullable=False, server_default="")
        )
    if pg:
        bind.execute(
            sa.text("ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete")
        )
    prev = GENESIS_HASH
    for row, body in list(_chain_rows(bind, with_hashes=False)):
        h = _step(prev, json.loads(json.dumps(body)))
        bind.execute(
            sa.text("UPDATE audit_events SET prev_hash = :p, chain_hash = :h WHERE seq = :s"),
            {"p": prev, "h": h, "s": row.seq},
        )
        prev = h
    if pg:
        bind.execute(
            sa.text("ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update_delete")
        )
