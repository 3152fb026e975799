"""PostgreSQL restarted in the middle of an ingest run, and the server sent SIGTERM in the
middle of a batch: the API answers what it cannot do as 503 problem+json (never a bare 500),
the Tagger retries, and every tag ends up stored exactly once, no batch half-written.

The database restarted here is a private cluster started by the test (initdb into a
temporary directory, its own port), never the shared server."""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from api.tagger import Tagger
from registry import db
from registry.db import session_scope
from registry.tables import RequestTag
from registry.trust.audit_tree import verify_tree
from tests.pg_private import PrivatePostgres, pg_bin
from tests.requests.conftest import Served, build_registry
from tests.requests.test_tagger import _counts, _tag_all
from tests.serve_process import ApiServer, mint

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(pg_bin("initdb") is None, reason="needs the PostgreSQL server binaries"),
]
N = 6000
BATCH = 200


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres()
    pg.start()
    try:
        yield pg
    finally:
        db.dispose_engines()
        pg.destroy()


@pytest.fixture
def served_private(private_pg: PrivatePostgres, tmp_path: Path) -> Served:
    url = private_pg.url()
    db.upgrade(url)
    served = build_registry(url, tmp_path)
    db.dispose_engines()  # the test process holds no connection across the restart
    return served


def _retried(caplog: pytest.LogCaptureFixture) -> dict[str, int]:
    """Why the Tagger retried: HTTP status or connection error, from its log."""
    counts: dict[str, int] = {}
    for record in caplog.records:
        m = re.match(r"send failed, will retry: (HTTP \d{3}|\w+)", record.getMessage())
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def _wait_sent(tagger: Tagger, at_least: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while tagger.stats["sent_tags"] < at_least:
        assert time.monotonic() < deadline, tagger.stats
        time.sleep(0.01)


def _chain_ok(url: str) -> None:
    with session_scope(url) as s:
        report = verify_tree(s)
    assert report.ok, report


def test_postgres_restarted_mid_ingest(
    private_pg: PrivatePostgres,
    served_private: Served,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pairreg.tagger")
    s = served_private
    server = ApiServer(s.url, tmp_path / "home").start()
    server_log = server.log
    token = mint(s.url)
    db.dispose_engines()
    tagger = Tagger(server.url, token, tmp_path / "spool", batch_size=BATCH,
                    flush_interval=0.02, max_backoff=0.3)  # fmt: skip
    try:
        _tag_all(tagger, s, "pg", n=N)
        _wait_sent(tagger, 3 * BATCH)
        before = tagger.stats["sent_tags"]
        private_pg.restart(down_for=1.5)  # every connection cut, down 1.5 s, back
        assert before < N, "the run ended before the restart: make N larger"
        # while it was down the API said 503 (the Tagger retried), not 500
        assert tagger.flush(timeout=120), tagger.stats
        assert tagger.stats["send_errors"] > 0 and tagger.stats["rejected"] == 0
        # after the restart the server serves again without being restarted itself
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
    finally:
        tagger.close(timeout=5)
        server.stop()
    retried = _retried(caplog)
    assert retried.get("HTTP 503", 0) > 0, retried  # the outage was seen and named
    assert not any(k.startswith("HTTP 5") and k != "HTTP 503" for k in retried), retried
    assert "Traceback" not in server_log.read_text()
    assert _counts(s.url) == (N, N, N)  # every tag exactly once
    _chain_ok(s.url)
    db.dispose_engines()


def test_sigterm_mid_batch_is_graceful(
    private_pg: PrivatePostgres, served_private: Served, tmp_path: Path
) -> None:
    s = served_private
    server = ApiServer(s.url, tmp_path / "home").start()
    token = mint(s.url)
    db.dispose_engines()
    tagger = Tagger(server.url, token, tmp_path / "spool", batch_size=BATCH,
                    flush_interval=0.02, max_backoff=0.3, start=False)  # fmt: skip
    try:
        _tag_all(tagger, s, "term", n=N)  # queued first, so every batch is BATCH tags in order
        tagger.start()
        _wait_sent(tagger, 2 * BATCH)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)  # SIGTERM to uvicorn itself: graceful shutdown
        server.proc.wait(timeout=60)
        # uvicorn finishes in-flight requests, then re-raises the signal it caught
        assert server.proc.returncode in (0, -signal.SIGTERM), server.log.read_text()[-2000:]
        # nothing half-written: what is stored is whole batches (each one transaction)
        stored, distinct, _ = _counts(s.url)
        assert stored == distinct and stored % BATCH == 0 and 0 < stored < N, stored
        with session_scope(s.url) as sess:
            ids = sess.scalars(select(RequestTag.request_id)).all()
        per_batch: dict[int, int] = {}
        for rid in ids:  # term-00042 was in batch 42 // BATCH
            k = int(rid.rsplit("-", 1)[1]) // BATCH
            per_batch[k] = per_batch.get(k, 0) + 1
        assert set(per_batch.values()) == {BATCH}, per_batch
        db.dispose_engines()
        server.start()  # the client retries against the restarted server
        assert tagger.flush(timeout=120), tagger.stats
    finally:
        tagger.close(timeout=5)
        server.stop()
    assert "Traceback" not in server.log.read_text()
    assert _counts(s.url) == (N, N, N)
    _chain_ok(s.url)
    db.dispose_engines()
