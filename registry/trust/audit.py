"""The audit log: append inside the caller's transaction, integrate later; the log's key.

Each event is ``{"seq", "occurred_at" (ISO-8601 UTC, microseconds, "Z"), "actor", "action",
"entity_type", "entity_id", "payload"}``; its canonical JSON is a leaf of the RFC 6962
Merkle tree (``registry.trust.audit_tree``), which the log signs as C2SP checkpoints
(``registry.services.transparency``). Events are written in the same transaction as the
change they record, so a change without its event (or the reverse) cannot commit.

Writing an event takes no log-wide lock (the design of Tessera, behind Sigstore's Rekor
v2): :func:`append_event` inserts the event (its ``seq`` an id assigned at insert) and a
row in ``audit_pending``. The sequencer (:func:`integrate`, one at a time) gives committed
pending events their leaf indices in the order it finds them, appends the leaves and
deletes them from the queue. Everything that reads the tree integrates first, and
``pairreg serve`` integrates on a short timer (docs/transparency.md says why this order is
consistent).
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import delete, insert, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from registry.canonical import canonical_json
from registry.errors import InvalidInput
from registry.integrations import webhooks
from registry.tables import AuditEvent, AuditLeaf, AuditPending, utcnow
from registry.trust import audit_tree

# Arbitrary constants naming pairreg's locks among PostgreSQL advisory locks: the write
# lock some services take for their own read-then-write rules (no longer the log's), the
# sequencer's, and the checkpoint signer's.
_PG_WRITE_LOCK = 7_201_958_311
_PG_SEQUENCER_LOCK = 7_201_958_312
_PG_CHECKPOINT_LOCK = 7_201_958_313
# session.info keys: the transaction that wrote events / holds the sequencer lock.
_WROTE_EVENTS = "pairreg.audit.wrote_events"
_HOLDS_SEQUENCER = "pairreg.audit.holds_sequencer"
# Events integrated per sequencer transaction (each a short one).
INTEGRATE_BATCH = 256
# Seconds between two runs of ``pairreg serve``'s sequencer thread.
SEQUENCER_INTERVAL = 0.25
logger = logging.getLogger("pairreg.audit")


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(event: AuditEvent) -> dict[str, Any]:
    """The fields a leaf covers, in the documented canonical shape."""
    return {
        "seq": event.seq,
        "occurred_at": format_time(event.occurred_at),
        "actor": event.actor,
        "action": event.action,
        "entity_type": event.entity_type,
        "entity_id": event.entity_id,
        "payload": json.loads(event.payload),
    }


def lock_writes(session: Session) -> None:
    """Serialise the registry writers that take it for the rest of this transaction.

    Not the audit log's lock (appending an event takes none): services whose own rules read
    then write (a next version number, a deployment's live pair, telemetry deltas) take it
    before reading. SQLite transactions already begin with BEGIN IMMEDIATE, the same lock.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_WRITE_LOCK})


def lock_checkpoints(session: Session) -> None:
    """Serialise checkpoint signers (not writers, not the sequencer) for this transaction."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_CHECKPOINT_LOCK})


def append_event(
    session: Session,
    *,
    actor: str,
    action: str,
    entity_type: str,
    entity_id: str | int,
    payload: dict[str, Any],
) -> AuditEvent:
    """Write one event inside the caller's transaction, without a log-wide lock.

    Returns the event with its ``seq`` (the id callers cite); its leaf index is assigned
    when the sequencer integrates it, after the caller commits (:func:`leaf_index`)."""
    event = AuditEvent(
        occurred_at=utcnow(),
        actor=actor,
        action=action,
        entity_type=entity_type,
        entity_id=str(entity_id),
        payload=canonical_json(payload).decode("utf-8"),
    )
    session.add(event)
    session.flush()
    session.add(AuditPending(seq=event.seq))
    session.flush()
    session.info[_WROTE_EVENTS] = session.get_transaction()
    # Decisions owed to webhook subscribers join the outbox in this same transaction.
    webhooks.enqueue(session, event, payload)
    return event


# --- the sequencer ---------------------------------------------------------------------


def _integrate_batch(bind: Session | Connection, limit: int) -> int:
    """Give up to ``limit`` pending events their leaves, in ``seq`` order among those this
    transaction sees committed; the caller holds the sequencer lock."""
    pending = list(
        bind.execute(select(AuditPending.seq).order_by(AuditPending.seq).limit(limit)).scalars()
    )
    if not pending:
        return 0
    events = {
        e.seq: e
        for e in bind.execute(
            select(*_EVENT_COLUMNS).where(AuditEvent.__table__.c.seq.in_(pending))
        ).all()
    }
    index = audit_tree.tree_size(bind)
    for seq in pending:
        audit_tree.append_leaf(bind, index, audit_tree._body_of_row(events[seq]))
        bind.execute(insert(AuditLeaf.__table__), [{"idx": index, "seq": seq}])
        index += 1
    bind.execute(delete(AuditPending.__table__).where(AuditPending.__table__.c.seq.in_(pending)))
    return len(pending)


_EVENT_COLUMNS = [
    AuditEvent.__table__.c[n]
    for n in ("seq", "occurred_at", "actor", "action", "entity_type", "entity_id", "payload")
]


def integrate(session: Session, *, batch: int = INTEGRATE_BATCH) -> int:
    """The sequencer: integrate every committed pending event into the tree; returns how
    many. Called before anything reads the tree, and by ``pairreg serve`` on a timer.

    PostgreSQL: on a connection of its own, in short transactions (``batch`` events each)
    under an advisory lock only sequencers take, so no writer ever waits for it; it sees
    committed events only (READ COMMITTED, each statement a fresh snapshot taken after the
    lock is held), so an event whose transaction is still open is integrated by a later
    run, after the events committed before it. SQLite: in the caller's transaction, which
    already holds the database's one write lock (BEGIN IMMEDIATE)."""
    if session.scalar(select(AuditPending.seq).limit(1)) is None:
        return 0
    bind = session.get_bind()
    current = session.get_transaction()
    in_session = bind.dialect.name != "postgresql"
    if not in_session and session.info.get(_WROTE_EVENTS) is current:
        # This transaction wrote events and now reads the tree (a bundle or an archive built
        # in the transaction that ingested what it cites): integrate here, its own events
        # included, holding the sequencer lock until it ends; a rollback takes the leaves
        # with it. Writers are not affected, only other sequencers wait.
        if session.info.get(_HOLDS_SEQUENCER) is not current:
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_SEQUENCER_LOCK})
            session.info[_HOLDS_SEQUENCER] = current
        in_session = True
    if in_session:
        total = 0
        while n := _integrate_batch(session, batch):
            total += n
        return total
    engine = bind.engine.execution_options(isolation_level="READ COMMITTED")
    total = 0
    with engine.connect() as conn:
        while True:
            with conn.begin():
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_SEQUENCER_LOCK})
                n = _integrate_batch(conn, batch)
            total += n
            if n < batch:
                return total


def run_sequencer(url: str, stop: threading.Event, interval: float = SEQUENCER_INTERVAL) -> None:
    """Integrate pending events every ``interval`` seconds until ``stop`` is set (the
    thread ``pairreg serve`` runs), so the tree follows the writes even when nobody reads
    it. Several servers on one database each run one: the sequencer lock takes turns."""
    from registry import db  # registry.db imports this module lazily too

    while not stop.wait(interval):
        try:
            with db.session_scope(url) as session:
                integrate(session)
        except Exception as exc:  # noqa: BLE001 - logged; the next tick (or a reader) retries
            # One line, no traceback: a database restart is expected to land here.
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            logger.warning("audit sequencer: integration failed (%s); retrying", first)


def leaf_index(session: Session, seq: int) -> int | None:
    """The event's leaf in the tree, integrating pending events first; None when no such
    event is committed (or it is still in an open transaction elsewhere)."""
    integrate(session)
    return session.scalar(select(AuditLeaf.idx).where(AuditLeaf.seq == seq))


# --- the log's signing key -------------------------------------------------------------


def ensure_signing_key(path: Path, public_path: Path) -> Ed25519PublicKey:
    """Create the Ed25519 key kept outside the database (mode 0600), once."""
    if path.exists():
        return load_private_key(path).public_key()
    key = Ed25519PrivateKey.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.touch(mode=0o600)
    path.write_bytes(raw)
    path.chmod(0o600)
    public_path.write_bytes(public_pem(key.public_key()).encode())
    return key.public_key()


def load_private_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(f"{path} is not an Ed25519 private key", field="key")
    return key


def public_pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
