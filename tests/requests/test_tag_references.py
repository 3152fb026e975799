"""Request tags name deployments, pairs and batches without per-row foreign keys
(migration 0008): the named rows cannot disappear or change id, on both dialects."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from registry.db import session_scope
from registry.services import requests as svc
from registry.tables import Deployment, Pair, RequestBatch, RequestId, RequestTag
from tests.requests.conftest import ACTOR, Served

KEY = f"{ACTOR}/ref-0"  # the stored key of client id ref-0


def _ingest(s: Served, n: int = 3) -> int:
    tags = [
        {"request_id": f"ref-{i}", "deployment": s.deployment,
         "served_at": (s.t_b + timedelta(seconds=i + 1)).isoformat()}
        for i in range(n)
    ]  # fmt: skip
    with session_scope(s.url) as session:
        result = svc.ingest_requests(session, tags=tags, actor=ACTOR)
    assert result.batch_id is not None
    return result.batch_id


def _refused(url: str, sql: str, **params: object) -> None:
    with pytest.raises(DBAPIError), session_scope(url) as session:
        session.execute(text(sql), params)


def test_referenced_rows_stay(served: Served) -> None:
    s = served
    batch_id = _ingest(s)
    with session_scope(s.url) as session:
        tag = session.scalars(select(RequestTag).where(RequestTag.request_id == KEY)).one()
        pair_id, dep_id = tag.pair_id, tag.deployment_id
        unused_pair = session.scalar(select(Pair.id).where(Pair.pair_digest == s.pair_c))
    _refused(s.url, "DELETE FROM pairs WHERE id = :i", i=pair_id)
    _refused(s.url, "DELETE FROM pairs WHERE id = :i", i=unused_pair)  # all pairs are kept
    _refused(s.url, "DELETE FROM deployments WHERE id = :i", i=dep_id)
    _refused(s.url, "UPDATE pairs SET id = 999 WHERE id = :i", i=pair_id)
    _refused(s.url, "UPDATE deployments SET id = 999 WHERE id = :i", i=dep_id)
    _refused(s.url, "DELETE FROM request_batches WHERE id = :i", i=batch_id)
    _refused(s.url, "UPDATE request_batches SET id = 999 WHERE id = :i", i=batch_id)
    if s.url.startswith("postgresql"):
        for table in ("pairs", "deployments", "request_batches"):
            _refused(s.url, f"TRUNCATE {table} CASCADE")
    with session_scope(s.url) as session:  # other updates pass
        session.execute(text("UPDATE request_batches SET stored = stored WHERE id = :i"),
                        {"i": batch_id})  # fmt: skip
        session.execute(text("UPDATE pairs SET status = status WHERE id = :i"), {"i": pair_id})
        assert session.get(Pair, pair_id) and session.get(Deployment, dep_id)
        assert session.get(RequestBatch, batch_id) is not None
        assert (
            session.scalar(select(RequestId.batch_id).where(RequestId.request_id == KEY))
            == batch_id
        )


def test_a_batch_nobody_names_can_go(served: Served) -> None:
    """Ingest deletes its own batch row when every tag was a retry; that stays possible."""
    s = served
    _ingest(s)
    with session_scope(s.url) as session:
        result = svc.ingest_requests(
            session,
            tags=[{"request_id": "ref-0", "deployment": s.deployment,
                   "served_at": (s.t_b + timedelta(seconds=1)).isoformat()}],
            actor=ACTOR,
        )  # fmt: skip
        assert result.stored == 0 and result.batch_id is None
    with session_scope(s.url) as session:
        empty = RequestBatch(merkle_root="", received_digest="0" * 64, stored=0, duplicates=0,
                             inconsistent=0, actor=ACTOR)  # fmt: skip
        session.add(empty)
        session.flush()
        session.execute(text("DELETE FROM request_batches WHERE id = :i"), {"i": empty.id})
