"""The append-only audit log, its Merkle tree and signed checkpoints, the
retention policy, and the API tokens whose holders appear in the log."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from registry.tables.base import Base, UTCDateTime, utcnow


class AuditEvent(Base):
    """One state change. ``seq`` is the event's id, assigned at insert (a sequence on
    PostgreSQL, the rowid on SQLite) without any log-wide lock: ids are unique and increase
    in insert order, but may have gaps (a rolled-back insert) and need not follow commit
    order. Its place in the Merkle tree is assigned later, by the sequencer
    (``AuditLeaf``)."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_entity", "entity_type", "entity_id"),
        Index("ix_audit_events_occurred_at", "occurred_at"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime())
    actor: Mapped[str] = mapped_column(String(200), index=True)
    action: Mapped[str] = mapped_column(String(64), index=True)
    entity_type: Mapped[str] = mapped_column(String(32))
    entity_id: Mapped[str] = mapped_column(String(200))
    payload: Mapped[str] = mapped_column(Text)


class AuditTreeNode(Base):
    """One perfect subtree of the RFC 6962 tree over the audit events (see registry.trust.merkle).

    ``(level, idx)`` covers leaves ``[idx * 2**level, (idx + 1) * 2**level)``; which event
    leaf ``i`` holds is ``AuditLeaf``. Rows are written by the sequencer with the leaf that
    completes them, so proofs for any tree size read O(log² n) rows by primary key.
    """

    __tablename__ = "audit_tree"

    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    hash: Mapped[bytes] = mapped_column(LargeBinary(32))


class AuditPending(Base):
    """An event written but not yet in the tree: inserted in the event's own transaction
    (so it commits, or not, with the change it records), deleted by the sequencer in the
    transaction that gives the event its leaf."""

    __tablename__ = "audit_pending"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class AuditLeaf(Base):
    """Leaf ``idx`` of the tree is event ``seq``: assigned by the sequencer, one event at a
    time in the order it integrates them (``registry.trust.audit.integrate``), never changed."""

    __tablename__ = "audit_leaves"

    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    # No foreign keys here: what ties a leaf to its event is the leaf hash, recomputed by
    # every verification (a leaf whose event is gone is reported, not refused by a
    # constraint an attacker holding the database would drop anyway).
    seq: Mapped[int] = mapped_column(Integer, unique=True)


class LogCheckpoint(Base):
    """A checkpoint the log signed (C2SP signed note); the log never signs an inconsistent
    one, so each new checkpoint is checked against the newest of these first."""

    __tablename__ = "log_checkpoints"

    tree_size: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    root_hash: Mapped[str] = mapped_column(String(64))
    origin: Mapped[str] = mapped_column(String(200))
    key_id: Mapped[str] = mapped_column(String(8))
    note: Mapped[str] = mapped_column(Text)
    signed_by: Mapped[str] = mapped_column(String(200))
    signed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RetentionPolicy(Base):
    """How long records of one kind must be kept before anything may delete them.

    Read by the services that archive or drop records and by database triggers that refuse
    a ``DELETE`` of a request tag younger than this, whoever issues it.
    """

    __tablename__ = "retention_policies"

    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    months: Mapped[int] = mapped_column(Integer)
    updated_by: Mapped[str] = mapped_column(String(200))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiToken(Base):
    """A bearer token, stored only as the SHA-256 of its secret."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
