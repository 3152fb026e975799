"""Ingest: idempotency, conflicts, fill-in, consistency, audit event, queries (both dialects)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import select

from registry.db import session_scope
from registry.errors import InvalidInput, NotFound
from registry.services import requests as svc
from registry.tables import AuditEvent, RequestId, RequestTag
from registry.trust.bundle_verify import merkle_root, tag_digest
from tests.requests.conftest import ACTOR, Served


def _tag(s: Served, rid: str, at, pair=None, **kw):  # type: ignore[no-untyped-def]
    out = {
        "request_id": rid,
        "deployment": s.deployment,
        "served_at": at.isoformat(),
        "input_tokens": 10,
        "output_tokens": 20,
    }
    if pair:
        out["pair_digest"] = pair
    out.update(kw)
    return out


def _ingest(url: str, tags):  # type: ignore[no-untyped-def]
    with session_scope(url) as session:
        return svc.ingest_requests(session, tags=tags, actor=ACTOR)


def test_fill_in_idempotency_and_consistency(served: Served) -> None:
    s = served
    during_a = s.t_a + timedelta(minutes=5)
    during_b = s.t_b + timedelta(minutes=5)
    spec = {
        "num_spec_steps": 4,
        "num_draft_tokens": 16,
        "num_accepted_draft_tokens": 9,
        "acceptance_histogram": [1, 0, 1, 1, 1],
    }
    tags = [
        _tag(s, "r-1", during_a),  # filled: a
        _tag(s, "r-2", during_b),  # filled: b
        _tag(s, "r-3", during_b, s.pair_b, spec=spec),  # explicit, consistent
        _tag(s, "r-4", during_b, s.pair_a),  # a was no longer live: inconsistent
        _tag(s, "r-5", during_a, s.pair_c),  # c never live: inconsistent
    ]
    first = _ingest(s.url, tags)
    assert (first.received, first.stored, first.duplicates) == (5, 5, 0)
    assert first.inconsistent == 2 and sorted(first.inconsistent_ids) == ["r-4", "r-5"]

    again = _ingest(s.url, tags)
    assert (again.stored, again.duplicates, again.batch_id) == (0, 5, None)
    # a retry whose digest was filled in is identical to one that names the same pair
    same = _ingest(s.url, [_tag(s, "r-1", during_a, s.pair_a)])
    assert (same.stored, same.duplicates) == (0, 1)

    with session_scope(s.url) as session:
        assert session.query(RequestTag).count() == 5
        assert session.query(RequestId).count() == 5
        r1 = svc.get_request_tag(session, request_id="r-1")
        assert r1.pair_digest == s.pair_a and r1.pair_filled and r1.consistent
        r2 = svc.get_request_tag(session, request_id="r-2")
        assert r2.pair_digest == s.pair_b and r2.pair_filled
        r3 = svc.get_request_tag(session, request_id="r-3")
        assert r3.spec == spec and not r3.pair_filled and r3.consistent
        assert r3.tag_digest == tag_digest(
            request_id="r-3",
            deployment=s.deployment,
            pair_digest=s.pair_b,
            served_at=during_b,
            input_tokens=10,
            output_tokens=20,
            spec=spec,
        )
        events = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "requests.ingested")
        ).all()
        assert len(events) == 1  # retries wrote no event
        payload = json.loads(events[0].payload)
        assert payload["stored"] == 5 and payload["inconsistent"] == 2
        digests = [
            svc.get_request_tag(session, request_id=f"r-{i}").tag_digest for i in range(1, 6)
        ]
        assert payload["merkle_root"] == merkle_root(digests)

        bad = svc.list_requests(session, inconsistent=True)
        assert [t.request_id for t in bad.items] == ["r-5", "r-4"]  # by served_at
        assert bad.counts.total == 2 and bad.counts.inconsistent == 2


def test_conflict_is_reported_per_tag_and_the_rest_stored(served: Served) -> None:
    s = served
    at = s.t_b + timedelta(minutes=1)
    _ingest(s.url, [_tag(s, "x-1", at), _tag(s, "x-2", at)])
    res = _ingest(
        s.url,
        [_tag(s, "x-1", at, output_tokens=99), _tag(s, "x-2", at), _tag(s, "x-3", at)],
    )
    assert (res.stored, res.duplicates, res.conflicted) == (1, 1, 1)
    assert [(c.index, c.request_id, c.reason) for c in res.conflicts] == [(0, "x-1", "recorded")]
    with session_scope(s.url) as session:
        assert session.query(RequestId).count() == 3  # x-3 was stored
    # same id twice in one batch with different content: the first is stored
    res = _ingest(s.url, [_tag(s, "y-1", at), _tag(s, "y-1", at, input_tokens=1)])
    assert (res.stored, res.conflicted, res.conflicts[0].reason) == (1, 1, "batch")


def test_invalid_tags(served: Served) -> None:
    s = served
    at = s.t_b + timedelta(minutes=1)
    with pytest.raises(InvalidInput, match="unknown pair digest") as err:
        _ingest(s.url, [_tag(s, "u-1", at, "f" * 64)])
    assert err.value.status == 422
    with pytest.raises(InvalidInput, match="unknown deployment"):
        _ingest(s.url, [{**_tag(s, "u-2", at), "deployment": "nope"}])
    with pytest.raises(InvalidInput, match="no pair was live"):
        _ingest(s.url, [_tag(s, "u-3", s.t_a - timedelta(days=1))])
    with pytest.raises(InvalidInput, match="timezone"):
        _ingest(s.url, [{**_tag(s, "u-4", at), "served_at": "2026-01-01T00:00:00"}])
    with pytest.raises(InvalidInput, match="at most 10000"):
        _ingest(s.url, [_tag(s, f"n-{i}", at) for i in range(10_001)])
    with session_scope(s.url) as session, pytest.raises(NotFound):
        svc.get_request_tag(session, request_id="u-1")


def test_audit_request_and_pagination(served: Served) -> None:
    s = served
    base = s.t_b + timedelta(minutes=1)
    _ingest(s.url, [_tag(s, f"p-{i:03d}", base + timedelta(seconds=i)) for i in range(25)])
    _ingest(s.url, [_tag(s, "old", s.t_a + timedelta(minutes=1))])
    with session_scope(s.url) as session:
        audit = svc.audit_request(session, request_id="p-003")
        assert audit.tag.pair_digest == s.pair_b
        assert audit.pair["pair_digest"] == s.pair_b
        assert audit.pair["target"]["manifest"] and audit.pair["drafter"]["manifest"]
        assert audit.deployment_event is not None
        assert audit.deployment_event["to_pair_digest"] == s.pair_b
        assert audit.deployment_event["from_pair_digest"] == s.pair_a
        assert audit.live_pair_digest == s.pair_b
        old = svc.audit_request(session, request_id="old")
        assert old.deployment_event["to_pair_digest"] == s.pair_a

        seen, cursor = [], None
        while True:
            page = svc.list_requests(
                session, pair=s.pair_b[:16], since=base, cursor=cursor, limit=10
            )
            assert page.counts.total == 25 and page.counts.output_tokens == 25 * 20
            seen += [t.request_id for t in page.items]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == [f"p-{i:03d}" for i in range(25)]
        window = svc.list_requests(
            session,
            deployment=s.deployment,
            since=base + timedelta(seconds=5),
            until=base + timedelta(seconds=8),
        )
        assert [t.request_id for t in window.items] == ["p-005", "p-006", "p-007"]
        assert svc.list_requests(session, pair=s.pair_a).counts.total == 1


def test_concurrent_overlapping_batches(served: Served) -> None:
    """Batches racing on the same ids store each id once and report the rest as duplicates."""
    import threading

    s = served
    at = s.t_b + timedelta(minutes=2)
    batches = [[_tag(s, f"c-{i:04d}", at) for i in range(start, start + 600)]
               for start in (0, 200, 400, 0)]  # fmt: skip
    results, errors = [], []

    def run(batch):  # type: ignore[no-untyped-def]
        try:
            results.append(_ingest(s.url, batch))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.stored for r in results) == 1000
    assert sum(r.duplicates for r in results) == 4 * 600 - 1000
    with session_scope(s.url) as session:
        assert session.query(RequestTag).count() == 1000


def test_partial_retry_stores_only_the_new_tags(served: Served) -> None:
    """A batch mixing retries with new ids stores the new ones only; the batch row, its Merkle
    root and its one audit event cover exactly those; a batch of retries writes nothing."""
    from registry.tables import RequestBatch

    s = served
    at = s.t_b + timedelta(minutes=3)
    first = _ingest(s.url, [_tag(s, f"m-{i}", at) for i in range(3)])
    mixed = [_tag(s, f"m-{i}", at) for i in range(5)]
    second = _ingest(s.url, list(reversed(mixed)))
    assert (second.received, second.stored, second.duplicates) == (5, 2, 3)
    assert second.batch_id is not None and second.batch_id != first.batch_id
    with session_scope(s.url) as session:
        events = session.scalars(
            select(AuditEvent)
            .where(AuditEvent.action == "requests.ingested")
            .order_by(AuditEvent.seq)
        ).all()
        batch = session.get(RequestBatch, second.batch_id)
        ids = session.scalars(
            select(RequestId.client_request_id)
            .where(RequestId.batch_id == second.batch_id)
            .order_by(RequestId.request_id)
        ).all()
        digests = [svc.get_request_tag(session, request_id=r).tag_digest for r in ids]
        batches_before = session.query(RequestBatch).count()
        events_before = len(events)
    assert ids == ["m-3", "m-4"]
    assert batch is not None and (batch.stored, batch.duplicates) == (2, 3)
    assert batch.merkle_root == second.merkle_root == merkle_root(digests)
    assert batch.audit_seq == second.audit_seq == events[-1].seq
    payload = json.loads(events[-1].payload)
    assert (payload["stored"], payload["duplicates"], payload["batch_id"]) == (
        2,
        3,
        second.batch_id,
    )

    again = _ingest(s.url, mixed)
    assert (again.stored, again.duplicates, again.batch_id) == (0, 5, None)
    with session_scope(s.url) as session:
        assert session.query(RequestBatch).count() == batches_before
        assert (
            session.query(AuditEvent).filter(AuditEvent.action == "requests.ingested").count()
            == events_before
        )


def test_two_batches_in_one_transaction(served: Served) -> None:
    """The PostgreSQL staging table starts empty for each batch, even within one transaction."""
    s = served
    at = s.t_b + timedelta(minutes=4)
    with session_scope(s.url) as session:
        a = svc.ingest_requests(session, tags=[_tag(s, "t-1", at)], actor=ACTOR)
        b = svc.ingest_requests(session, tags=[_tag(s, "t-2", at)], actor=ACTOR)
    assert (a.stored, b.stored) == (1, 1) and a.batch_id != b.batch_id
    with session_scope(s.url) as session:
        assert (
            session.scalar(select(RequestId.batch_id).where(RequestId.client_request_id == "t-2"))
            == b.batch_id
        )
        assert session.query(RequestTag).count() == 2


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # the bulk path is PG's
def test_postgres_bulk_path_and_its_fallback(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a batch of new ids is stored by the bulk COPY alone; a batch holding an id
    already recorded has its COPY refused, rolled back to the savepoint, and goes through the
    careful path (retries skipped, the new ids stored, one batch row)."""
    from registry.requests import store as tag_store

    s = served
    careful = tag_store._store_ids_careful
    calls: list[int] = []

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(args[2]))
        return careful(*args, **kwargs)

    monkeypatch.setattr(tag_store, "_store_ids_careful", spy)
    at = s.t_b + timedelta(minutes=5)
    first = _ingest(s.url, [_tag(s, f"b-{i:03d}", at) for i in range(50)])
    assert (first.stored, calls) == (50, [])
    second = _ingest(s.url, [_tag(s, f"b-{i:03d}", at) for i in range(40, 60)])
    assert (second.stored, second.duplicates, calls) == (10, 10, [20])
    with session_scope(s.url) as session:
        ids = session.scalars(
            select(RequestId.client_request_id).where(RequestId.batch_id == second.batch_id)
        ).all()
        assert sorted(ids) == [f"b-{i:03d}" for i in range(50, 60)]
        assert session.query(RequestTag).count() == 60
