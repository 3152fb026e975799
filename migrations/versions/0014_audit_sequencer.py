"""audit sequencer: events are written without a log-wide lock, the tree is integrated later

Revision ID: 0014
Revises: 0012
Create Date: 2026-12-03 16:30:00.000000

* ``audit_events.seq`` becomes an id assigned at insert: a sequence on PostgreSQL (started
  after the highest existing ``seq``), the rowid on SQLite (the column already is one).
* ``audit_pending``: events written but not yet in the Merkle tree (a queue the sequencer
  empties).
* ``audit_leaves``: leaf index → event ``seq``. Every existing event keeps the leaf it had
  (leaf ``seq - 1``), so every checkpoint, proof, bundle and archive made before stays valid.
  Append-only like the tree (PostgreSQL and SQLite triggers).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from registry.tables.base import UTCDateTime
from registry.trust import audit_tree

revision = "0014"
down_revision = "0012"
branch_labels = None
depends_on = None

_SEQUENCE = "audit_events_seq_seq"


def upgrade() -> None:
    bind = op.get_bind()
    op.create_table(
        "audit_pending",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_pending")),
    )
    op.create_table(
        "audit_leaves",
        sa.Column("idx", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("idx", name=op.f("pk_audit_leaves")),
        sa.UniqueConstraint("seq", name=op.f("uq_audit_leaves_seq")),
    )
    # Until now leaf i was event i + 1 (a gapless sequence written under a lock) and the
    # tree covered every event: carry that mapping over as it was.
    op.execute("INSERT INTO audit_leaves (idx, seq) SELECT seq - 1, seq FROM audit_events")
    if bind.dialect.name == "postgresql":
        op.execute(f"CREATE SEQUENCE {_SEQUENCE} OWNED BY audit_events.seq")
        op.execute(
            f"SELECT setval('{_SEQUENCE}', COALESCE((SELECT MAX(seq) FROM audit_events), 0) + 1, "
            "false)"
        )
        op.execute(f"ALTER TABLE audit_events ALTER COLUMN seq SET DEFAULT nextval('{_SEQUENCE}')")
        op.execute(
            "CREATE TRIGGER audit_leaves_no_update_delete BEFORE UPDATE OR DELETE "
            "ON audit_leaves FOR EACH ROW EXECUTE FUNCTION pairreg_audit_append_only()"
        )
        op.execute(
            "CREATE TRIGGER audit_leaves_no_truncate BEFORE TRUNCATE "
            "ON audit_leaves FOR EACH STATEMENT EXECUTE FUNCTION pairreg_audit_append_only()"
        )
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_leaves_no_{verb.lower()} BEFORE {verb} ON audit_leaves "
                f"BEGIN SELECT RAISE(ABORT, 'audit_leaves is append-only ({verb} refused)'); END"
            )


_EVENTS = sa.table(
    "audit_events",
    sa.column("seq", sa.Integer()),
    sa.column("occurred_at", UTCDateTime()),
    *(sa.column(c, sa.String()) for c in ("actor", "action", "entity_type", "entity_id")),
    sa.column("payload", sa.Text()),
)
_PENDING = sa.table("audit_pending", sa.column("seq", sa.Integer()))
_LEAVES = sa.table(
    "audit_leaves", sa.column("idx", sa.BigInteger()), sa.column("seq", sa.Integer())
)


def _integrate_pending(bind: sa.engine.Connection) -> None:
    """What the sequencer does (registry.trust.audit.integrate), done here: the lock-based log
    has no queue, so every pending event joins the tree before the queue goes."""
    rows = bind.execute(
        sa.select(_EVENTS)
        .where(_EVENTS.c.seq.in_(sa.select(_PENDING.c.seq)))
        .order_by(_EVENTS.c.seq)
    ).all()
    index = audit_tree.tree_size(bind)
    for row in rows:
        audit_tree.append_leaf(bind, index, audit_tree._body_of_row(row))
        bind.execute(sa.insert(_LEAVES).values(idx=index, seq=row.seq))
        index += 1
    bind.execute(sa.delete(_PENDING))


def downgrade() -> None:
    bind = op.get_bind()
    _integrate_pending(bind)
    # The lock-based log needs leaf i == event i + 1.
    shifted = bind.execute(
        sa.text("SELECT COUNT(*) FROM audit_leaves WHERE idx <> seq - 1")
    ).scalar()
    if shifted:
        raise RuntimeError(
            f"{shifted} audit events are not at leaf seq - 1 (writers overlapped, or a "
            "transaction rolled back): the lock-based log cannot represent this log; "
            "refusing to downgrade"
        )
    if bind.dialect.name == "postgresql":
        op.execute("ALTER TABLE audit_events ALTER COLUMN seq DROP DEFAULT")
        op.execute(f"DROP SEQUENCE IF EXISTS {_SEQUENCE}")
        op.execute("DROP TRIGGER IF EXISTS audit_leaves_no_update_delete ON audit_leaves")
        op.execute("DROP TRIGGER IF EXISTS audit_leaves_no_truncate ON audit_leaves")
    else:
        for verb in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS audit_leaves_no_{verb}")
    op.drop_table("audit_leaves")
    op.drop_table("audit_pending")
