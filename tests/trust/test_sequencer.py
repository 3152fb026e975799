"""The audit sequencer: writers append events without a log-wide lock; the sequencer gives
committed events their leaves in the order it finds them, and every reader integrates
first. On PostgreSQL a writer whose transaction is held open no longer blocks another
writer (the lock-based log made the second wait for the first's commit)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select, text

from registry.db import get_engine, session_scope
from registry.errors import NotFound
from registry.services import transparency as tl
from registry.settings import Settings
from registry.tables import AuditLeaf, AuditPending
from registry.trust import audit, audit_tree, merkle


def _event(session, name: str):  # type: ignore[no-untyped-def]
    return audit.append_event(
        session,
        actor="test:writer",
        action="test.event",
        entity_type="test",
        entity_id=name,
        payload={"name": name},
    )


def _proves(url: str, seq: int) -> int:
    """The event's inclusion proof checks against the current root; returns its leaf."""
    with session_scope(url) as s:
        p = tl.prove_inclusion(s, seq=seq)
    leaf = merkle.leaf_hash(p.leaf_data.encode())
    path = [bytes.fromhex(h) for h in p.path]
    assert p.event["seq"] == seq
    assert merkle.verify_inclusion(
        leaf, p.leaf_index, p.tree_size, path, bytes.fromhex(p.root_hash)
    )
    return p.leaf_index


def test_readers_integrate_first_and_leaves_follow_integration(home: Settings) -> None:
    url = home.db_url
    with session_scope(url) as s:
        before = tl.verify_audit_log(s).tree_size
        seqs = [_event(s, f"e{i}").seq for i in range(3)]
    with session_scope(url) as s:  # written, not yet in the tree: pending
        assert audit_tree.tree_size(s) == before
        assert sorted(s.scalars(select(AuditPending.seq))) == seqs
    assert [_proves(url, seq) for seq in seqs] == [before, before + 1, before + 2]
    with session_scope(url) as s:
        assert s.scalar(select(func.count()).select_from(AuditPending)) == 0
        report = tl.verify_audit_log(s)
    assert report.ok and report.tree_size == before + 3


def test_a_rolled_back_event_leaves_no_leaf_and_no_hole(home: Settings) -> None:
    url = home.db_url
    with pytest.raises(RuntimeError):
        with session_scope(url) as s:
            lost = _event(s, "rolled-back").seq
            raise RuntimeError("the business change failed")
    with session_scope(url) as s:
        kept = _event(s, "kept").seq
    assert _proves(url, kept) >= 0
    with session_scope(url) as s:
        if lost != kept:  # PostgreSQL's sequence skips the rolled-back id; SQLite reuses it
            with pytest.raises(NotFound):
                tl.prove_inclusion(s, seq=lost)
        report = tl.verify_audit_log(s)
        leaves = list(s.scalars(select(AuditLeaf.idx).order_by(AuditLeaf.idx)))
    assert report.ok and leaves == list(range(report.tree_size))


def test_an_event_lost_from_the_queue_fails_verification(home: Settings) -> None:
    """An event that is neither in the tree nor pending (its queue row deleted) would never
    be integrated: verification names it."""
    url = home.db_url
    with session_scope(url) as s:
        seq = _event(s, "dropped").seq
    with get_engine(url).begin() as conn:
        conn.execute(text("DELETE FROM audit_pending WHERE seq = :s"), {"s": seq})
    with session_scope(url) as s:
        report = tl.verify_audit_log(s)
    assert not report.ok and report.first_bad_seq == seq
    assert f"event {seq} is neither in the tree nor pending" in (report.reason or "")


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_an_open_transaction_does_not_block_another_writer(home: Settings) -> None:
    """Writer A appends and keeps its transaction open; writer B appends and commits
    meanwhile (with the log-wide lock B waited for A: the timeout below fails it). The
    sequencer integrates B's event first, A's after A commits: leaves in commit order, ids
    in insert order, one consistent tree."""
    url = home.db_url
    with session_scope(url) as s:
        before = tl.verify_audit_log(s).tree_size
    a_written, a_release = threading.Event(), threading.Event()
    a_seq: list[int] = []

    def writer_a() -> None:
        with session_scope(url) as s:
            a_seq.append(_event(s, "A").seq)
            a_written.set()
            assert a_release.wait(30)

    thread = threading.Thread(target=writer_a)
    thread.start()
    try:
        assert a_written.wait(30)
        b_done: list[int] = []

        def writer_b() -> None:
            with session_scope(url) as s:
                # Fail rather than hang if anything makes B wait for A.
                s.execute(text("SET LOCAL lock_timeout = '5s'"))
                b_done.append(_event(s, "B").seq)

        started = time.monotonic()
        b = threading.Thread(target=writer_b)
        b.start()
        b.join(10)
        assert b_done, "writer B was blocked by writer A's open transaction"
        assert time.monotonic() - started < 5
        assert b_done[0] > a_seq[0]  # ids in insert order
        # A reader meanwhile: B is integrated, A (uncommitted) is not and does not block it.
        assert _proves(url, b_done[0]) == before
        with session_scope(url) as s:
            with pytest.raises(NotFound):
                tl.prove_inclusion(s, seq=a_seq[0])
    finally:
        a_release.set()
        thread.join(30)
    assert _proves(url, a_seq[0]) == before + 1  # leaves in commit order
    with session_scope(url) as s:
        report = tl.verify_audit_log(s)
        cp = tl.sign_log_checkpoint(s, actor="local:auditor")
    assert report.ok and report.tree_size == before + 2 and cp.tree_size == before + 2


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_concurrent_sequencers_give_each_event_one_leaf(home: Settings) -> None:
    """Many writers and several sequencers at once: every event gets exactly one leaf,
    leaves are gapless, the tree verifies."""
    url = home.db_url
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(10):
                with session_scope(url) as s:
                    _event(s, f"w{n}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def sequence() -> None:
        try:
            for _ in range(20):
                with session_scope(url) as s:
                    audit.integrate(s, batch=3)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=sequence) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    with session_scope(url) as s:
        report = tl.verify_audit_log(s)
        events = s.scalar(text("SELECT COUNT(*) FROM audit_events"))
        leaves = list(s.scalars(select(AuditLeaf.idx).order_by(AuditLeaf.idx)))
        mapped = s.scalar(text("SELECT COUNT(DISTINCT seq) FROM audit_leaves"))
    assert report.ok, report
    assert leaves == list(range(events)) and mapped == events == report.tree_size
