"""The audit log as an RFC 6962 Merkle tree, stored so that proofs stay fast.

Leaf ``i`` holds the audit event ``audit_leaves.seq`` of ``idx = i`` (assigned by the
sequencer, ``registry.trust.audit.integrate``; before it existed, leaf ``i`` was event
``i + 1``, and those leaves kept their places); its data is the event's canonical JSON body
(see :func:`registry.trust.audit.event_body`), so
``leaf_hash = SHA-256(0x00 || canonical_json(body))``. Every perfect subtree is stored in
``audit_tree`` when the leaf that completes it is appended (by the sequencer, under its
lock), so a root, an inclusion proof or a consistency proof for any tree size reads
O(log² n) rows by primary key instead of re-hashing n leaves.

The stored hashes are derived data: :func:`verify_tree` recomputes every leaf from the
events and every node from the leaves, and a verifier never trusts a stored leaf — it
recomputes the leaf from the event it is shown.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from registry.canonical import canonical_json
from registry.tables import AuditEvent, AuditLeaf, AuditPending, AuditTreeNode
from registry.trust import merkle

_NODES = AuditTreeNode.__table__
_EVENTS = AuditEvent.__table__
_INSERT_CHUNK = 5000
_KEY_CHUNK = 400

Bind = Session | Connection


def event_leaf_data(body: dict[str, Any]) -> bytes:
    return canonical_json(body)


def _body_of_row(row: Any) -> dict[str, Any]:
    # Local import: registry.trust.audit imports this module.
    from registry.trust.audit import format_time

    return {
        "seq": row.seq,
        "occurred_at": format_time(row.occurred_at),
        "actor": row.actor,
        "action": row.action,
        "entity_type": row.entity_type,
        "entity_id": row.entity_id,
        "payload": json.loads(row.payload),
    }


def fetch_nodes(bind: Bind, keys: Iterable[merkle.Key]) -> dict[merkle.Key, bytes]:
    """Stored subtree hashes by ``(level, idx)``, a few hundred keys per query."""
    wanted = sorted(set(keys))
    out: dict[merkle.Key, bytes] = {}
    for i in range(0, len(wanted), _KEY_CHUNK):
        by_level: dict[int, list[int]] = {}
        for level, idx in wanted[i : i + _KEY_CHUNK]:
            by_level.setdefault(level, []).append(idx)
        # ``level = L AND idx IN (...)`` per level: both dialects walk the primary key for
        # this (SQLite scans the whole table for a row-value ``(level, idx) IN``). Written as
        # SQL text with the integers inlined: building the equivalent expression tree costs
        # more than the query itself at this size.
        cond = " OR ".join(
            f"(level = {int(level)} AND idx IN ({','.join(str(int(i)) for i in idxs)}))"
            for level, idxs in by_level.items()
        )
        rows = bind.execute(text(f"SELECT level, idx, hash FROM audit_tree WHERE {cond}"))
        out.update({(lv, ix): bytes(h) for lv, ix, h in rows})
    return out


def append_leaf(bind: Bind, index: int, body: dict[str, Any]) -> bytes:
    """Store leaf ``index`` and every subtree it completes; returns the leaf hash."""
    leaf = merkle.leaf_hash(event_leaf_data(body))
    siblings = merkle.left_siblings(index)
    # The previous leaf too: the tree must cover every earlier event before this one joins.
    wanted = [*siblings, (0, index - 1)] if index else []
    known = fetch_nodes(bind, wanted) if wanted else {}
    missing = [k for k in wanted if k not in known]
    if missing:
        raise RuntimeError(
            f"audit tree is missing subtree {missing[0]} needed to append leaf {index}: "
            "the tree was not backfilled (`pairreg db upgrade` does it)"
        )
    rows = merkle.completed_nodes(index, leaf, known.__getitem__)
    bind.execute(insert(_NODES), [{"level": k[0], "idx": k[1], "hash": h} for k, h in rows])
    return leaf


def event_at(bind: Bind, index: int) -> int | None:
    """The ``seq`` of the event leaf ``index`` holds."""
    if not _has_leaf_table(bind):
        return index + 1
    leaves = AuditLeaf.__table__
    return bind.execute(select(leaves.c.seq).where(leaves.c.idx == index)).scalar()


def tree_size(bind: Bind) -> int:
    """Leaves stored (== events covered)."""
    top = bind.execute(select(func.max(_NODES.c.idx)).where(_NODES.c.level == 0)).scalar()
    return 0 if top is None else int(top) + 1


def hashes_for(bind: Bind, ranges: list[merkle.Range]) -> list[bytes]:
    """``MTH`` of each range, from stored subtrees fetched in one round trip."""
    nodes = fetch_nodes(bind, merkle.keys_for(ranges))
    missing = sorted(merkle.keys_for(ranges) - nodes.keys())
    if missing:
        raise RuntimeError(f"audit tree is missing stored subtree {missing[0]}")
    return [merkle.range_hash(a, b, nodes) for a, b in ranges]


def root(bind: Bind, size: int) -> bytes:
    if size == 0:
        return merkle.EMPTY_ROOT
    return hashes_for(bind, [(0, size)])[0]


@dataclass
class InclusionProof:
    index: int
    size: int
    leaf: bytes
    path: list[bytes]
    root: bytes


def inclusion_proof(bind: Bind, index: int, size: int) -> InclusionProof:
    ranges = merkle.inclusion_ranges(index, size)
    hashes = hashes_for(bind, [(index, index + 1), (0, size), *ranges])
    return InclusionProof(index, size, hashes[0], hashes[2:], hashes[1])


@dataclass
class ConsistencyProof:
    old_size: int
    new_size: int
    old_root: bytes
    new_root: bytes
    path: list[bytes]


def consistency_proof(bind: Bind, old: int, new: int) -> ConsistencyProof:
    ranges = merkle.consistency_ranges(old, new)
    roots = [r for r in ((0, old), (0, new)) if r[1] > 0]
    hashes = hashes_for(bind, [*roots, *ranges])
    old_root = hashes[0] if old else merkle.EMPTY_ROOT
    new_root = hashes[len(roots) - 1] if new else merkle.EMPTY_ROOT
    return ConsistencyProof(old, new, old_root, new_root, hashes[len(roots) :])


# --- rebuilding and verifying from the events --------------------------------------------


class LeafError(RuntimeError):
    """A leaf the events cannot account for; ``seq`` names the event when there is one."""

    def __init__(self, seq: int | None, reason: str) -> None:
        super().__init__(reason)
        self.seq = seq


def _has_leaf_table(bind: Bind) -> bool:
    """False only inside the migrations before ``audit_leaves`` existed (leaf i = seq i+1)."""
    conn = bind.connection() if isinstance(bind, Session) else bind
    return inspect(conn).has_table("audit_leaves")


def leaves_from_events(bind: Bind, *, after: int = 0, batch: int = 5000) -> Iterator[bytes]:
    """Leaf hashes recomputed from the events, in leaf order from leaf ``after`` on
    (streamed in batches); raises on a leaf index missing from the mapping."""
    for _seq, leaf in leaf_rows(bind, after=after, batch=batch):
        yield leaf


def leaf_rows(bind: Bind, *, after: int = 0, batch: int = 5000) -> Iterator[tuple[int, bytes]]:
    """``(event seq, leaf hash recomputed from the event)`` in leaf order from ``after``."""
    if not _has_leaf_table(bind):
        yield from _leaves_by_seq(bind, after_seq=after, batch=batch)
        return
    leaves = AuditLeaf.__table__
    cols = [leaves.c.idx, leaves.c.seq.label("leaf_seq"), *(_EVENTS.c[n] for n in _BODY)]
    last = after - 1
    while True:
        rows = bind.execute(
            select(*cols)
            .select_from(leaves)
            .outerjoin(_EVENTS, _EVENTS.c.seq == leaves.c.seq)
            .where(leaves.c.idx > last)
            .order_by(leaves.c.idx)
            .limit(batch)
        ).all()
        if not rows:
            return
        for row in rows:
            if row.idx != last + 1:
                raise LeafError(None, f"no event is mapped to leaf {last + 1}")
            if row.seq is None:
                raise LeafError(row.leaf_seq, f"event {row.leaf_seq} (leaf {row.idx}) is gone")
            yield row.seq, merkle.leaf_hash(event_leaf_data(_body_of_row(row)))
            last = row.idx


_BODY = ("seq", "occurred_at", "actor", "action", "entity_type", "entity_id", "payload")


def _leaves_by_seq(
    bind: Bind, *, after_seq: int = 0, batch: int = 5000
) -> Iterator[tuple[int, bytes]]:
    """The layout before the sequencer (migrations 0005-0010): leaf i is event i + 1."""
    last = after_seq
    cols = [
        _EVENTS.c.seq,
        _EVENTS.c.occurred_at,
        _EVENTS.c.actor,
        _EVENTS.c.action,
        _EVENTS.c.entity_type,
        _EVENTS.c.entity_id,
        _EVENTS.c.payload,
    ]
    while True:
        rows = bind.execute(
            select(*cols).where(_EVENTS.c.seq > last).order_by(_EVENTS.c.seq).limit(batch)
        ).all()
        if not rows:
            return
        for row in rows:
            if row.seq != last + 1:
                raise LeafError(
                    last + 1, f"audit sequence gap: expected {last + 1}, found {row.seq}"
                )
            yield row.seq, merkle.leaf_hash(event_leaf_data(_body_of_row(row)))
            last = row.seq


def rebuild(bind: Bind) -> int:
    """Recompute the whole stored tree from the events (the migration's backfill).

    Deletes what was stored first, so it also repairs a tree whose rows were lost. Returns
    the number of leaves.
    """
    bind.execute(delete(_NODES))
    pending: list[dict[str, Any]] = []
    count = 0
    for (level, idx), h in merkle.build_nodes(leaves_from_events(bind)):
        pending.append({"level": level, "idx": idx, "hash": h})
        count += level == 0
        if len(pending) >= _INSERT_CHUNK:
            bind.execute(insert(_NODES), pending)
            pending = []
    if pending:
        bind.execute(insert(_NODES), pending)
    return count


def _events_outside_the_log(bind: Bind) -> int | None:
    """An event with no leaf and not waiting in ``audit_pending`` (its queue row deleted by
    hand): the sequencer would never integrate it. Two counts, then a search if they differ."""
    if not _has_leaf_table(bind):
        return None
    leaves, pending = AuditLeaf.__table__, AuditPending.__table__
    events = bind.execute(select(func.count()).select_from(_EVENTS)).scalar() or 0
    known = (bind.execute(select(func.count()).select_from(leaves)).scalar() or 0) + (
        bind.execute(select(func.count()).select_from(pending)).scalar() or 0
    )
    if events == known:
        return None
    return bind.execute(
        select(func.min(_EVENTS.c.seq)).where(
            ~_EVENTS.c.seq.in_(select(leaves.c.seq)), ~_EVENTS.c.seq.in_(select(pending.c.seq))
        )
    ).scalar()


@dataclass
class TreeReport:
    ok: bool
    size: int
    root: bytes
    first_bad_seq: int | None = None
    reason: str | None = None


def stream_level(
    bind: Bind, level: int, batch: int = 5000, *, start: int = 0
) -> Iterator[tuple[int, bytes]]:
    """Stored subtrees of one level from index ``start`` on, in index order (a primary-key
    range scan per batch)."""
    last = start - 1
    while True:
        rows = bind.execute(
            select(_NODES.c.idx, _NODES.c.hash)
            .where(_NODES.c.level == level, _NODES.c.idx > last)
            .order_by(_NODES.c.idx)
            .limit(batch)
        ).all()
        if not rows:
            return
        for idx, h in rows:
            yield int(idx), bytes(h)
        last = int(rows[-1][0])


def verify_tree(bind: Bind, *, batch: int = 5000, after: int = 0) -> TreeReport:
    """Recompute every leaf from its event, then every stored subtree from the level below.

    Level by level, each a streamed primary-key scan, so memory stays flat at any size.
    ``after``: check only leaves from that index on and the subtrees that cover them (an
    incremental run from a size verified before, whose root the caller checks against a
    signed checkpoint)."""
    size = tree_size(bind)
    if after > size:
        return TreeReport(
            False, size, b"", size + 1, f"{size} leaves stored, {after} verified before"
        )
    count = after
    stored = stream_level(bind, 0, batch, start=after)
    try:
        for index, (seq, leaf) in enumerate(leaf_rows(bind, after=after), start=after):
            got = next(stored, None)
            if got is None:
                return TreeReport(False, size, b"", seq, f"event {seq} has no stored leaf")
            if got != (index, leaf):
                return TreeReport(
                    False, size, b"", seq, f"stored leaf {got[0]} differs from event {seq}"
                )
            count += 1
    except LeafError as exc:
        return TreeReport(False, size, b"", exc.seq, str(exc))
    lost = _events_outside_the_log(bind)
    if lost is not None:
        return TreeReport(
            False, size, b"", lost, f"event {lost} is neither in the tree nor pending"
        )
    if next(stored, None) is not None or count != size:
        return TreeReport(False, size, b"", count + 1, f"{size} leaves stored, {count} events")
    level, width = 1, size // 2
    while width:
        first = after >> level
        below = stream_level(bind, level - 1, batch, start=2 * first)
        here = stream_level(bind, level, batch, start=first)
        for i in range(first, width):
            left, right, got = next(below), next(below), next(here, None)
            want = merkle.node_hash(left[1], right[1])
            if got != (i, want):
                return TreeReport(
                    False,
                    size,
                    b"",
                    event_at(bind, i << level),
                    f"stored subtree ({level}, {i}) is not the hash of its children",
                )
        if next(here, None) is not None:
            return TreeReport(False, size, b"", None, f"extra stored subtrees at level {level}")
        level, width = level + 1, width // 2
    return TreeReport(True, size, root(bind, size))
