"""Writes in worker processes (``PAIRREG_WRITE_PROCESSES``, api/write_pool.py), on a real
``pairreg serve`` and PostgreSQL: answers and errors as from a thread, a worker killed in the
middle of a write, and no worker outliving the server however the server ends."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from registry import db
from registry.db import get_engine, session_scope
from registry.trust.audit import _PG_WRITE_LOCK
from registry.trust.audit_tree import verify_tree
from tests.fixtures import write_fake_model
from tests.serve_process import ApiServer, mint

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
POOL = {"PAIRREG_WRITE_PROCESSES": "2"}


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return out


def _tree(pid: int) -> list[int]:
    """``pid``'s descendants (the fork server, its resource tracker, the workers)."""
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _workers(pid: int) -> list[int]:
    """The pool's workers: the children of the server's fork server."""
    return [w for c in _children(pid) for w in _children(c)]


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has ended
            alive.append(pid)
    return alive


def _gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pids):
            return True
        time.sleep(0.1)
    return False


def _server(db_url: str, tmp_path: Path) -> tuple[ApiServer, httpx.Client]:
    server = ApiServer(db_url, tmp_path / "home", env=POOL).start()
    admin = mint(db_url, role="admin", name="pool-admin")
    client = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {admin}"}, timeout=60
    )
    return server, client


def test_writes_and_their_errors_cross_the_process_boundary(db_url: str, tmp_path: Path) -> None:
    server, client = _server(db_url, tmp_path)
    try:
        workers = _alive(_tree(server.proc.pid))  # type: ignore[union-attr]
        assert len(_workers(server.proc.pid)) == 2, "the workers start with the server"  # type: ignore[union-attr]
        model = write_fake_model(tmp_path / "home" / "models" / "m", weights=b"pool")
        body = {"source": str(model), "name": "pool/m", "role": "target"}
        first = client.post("/v1/artifacts", json=body)
        assert first.status_code == 201, first.text
        again = client.post("/v1/artifacts", json=body)  # identical content: unchanged
        assert (
            again.status_code == 200
            and again.json()["artifact"]["id"] == first.json()["artifact"]["id"]
        )
        assert client.post("/v1/tokens", json={"name": "p1", "role": "reader"}).status_code == 201
        dup = client.post("/v1/tokens", json={"name": "p1", "role": "reader"})
        assert dup.status_code == 409, dup.text  # a registry error raised in the worker
        assert dup.headers["content-type"] == "application/problem+json"
        assert dup.json()["kind"] == "conflict" and dup.json()["field"] == "name"
        missing = client.post("/v1/deployments/nowhere/promote", json={"pair": "1", "reason": "x"})
        assert missing.status_code == 404 and missing.json()["kind"] == "not_found"
        bad = client.post(
            "/v1/requests",
            json={"tags": [{"request_id": "r1", "deployment": "nowhere",
                            "served_at": "2026-11-29T14:00:00Z"}]},
        )  # fmt: skip
        assert bad.status_code == 422 and bad.json()["field"] == "deployment", bad.text
        # a read sees at once what a worker committed
        assert client.get("/v1/artifacts/pool/m@latest").status_code == 200
    finally:
        server.stop()
    assert _gone(workers), "workers outlived a server stopped with SIGTERM"
    with session_scope(db_url) as s:
        assert verify_tree(s).ok


def test_a_worker_killed_mid_write_is_a_503_and_the_pool_recovers(
    db_url: str, tmp_path: Path
) -> None:
    server, client = _server(db_url, tmp_path)
    db.dispose_engines()
    blocker = get_engine(db_url).connect()
    blocker.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_WRITE_LOCK})
    locked = True
    try:
        import threading

        answers: list[httpx.Response] = []
        write = threading.Thread(
            target=lambda: answers.append(
                client.post("/v1/tokens", json={"name": "doomed", "role": "reader"})
            )
        )
        write.start()
        time.sleep(1.5)  # the write waits on the lock inside a worker
        workers = _alive(_workers(server.proc.pid))  # type: ignore[union-attr]
        assert len(workers) == 2
        with session_scope(db_url) as s:  # one worker's backend waits for the lock
            waiting = s.execute(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            ).scalar()
            assert waiting == 1
        for pid in workers:  # both: the one running the write dies for sure
            os.kill(pid, signal.SIGKILL)
        write.join(30)
        assert answers and answers[0].status_code == 503, answers and answers[0].text
        assert answers[0].headers["retry-after"] == "1"
        blocker.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_WRITE_LOCK})
        blocker.commit()
        locked = False
        retry = client.post("/v1/tokens", json={"name": "doomed", "role": "reader"})
        assert retry.status_code == 201, retry.text  # the killed write stored nothing
    finally:
        if locked:
            blocker.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_WRITE_LOCK})
        blocker.close()
        server.stop()
    with session_scope(db_url) as s:
        assert verify_tree(s).ok


def test_workers_end_when_the_server_is_killed(db_url: str, tmp_path: Path) -> None:
    server, client = _server(db_url, tmp_path)
    assert client.post("/v1/tokens", json={"name": "k1", "role": "reader"}).status_code == 201
    pid = server.proc.pid  # type: ignore[union-attr]
    workers = _alive(_tree(pid))
    assert len(_workers(pid)) == 2
    os.kill(pid, signal.SIGKILL)  # the server alone: no shutdown runs
    server.proc.wait(10)  # type: ignore[union-attr]
    try:
        assert _gone(workers), f"orphaned write workers: {_alive(workers)}"
    finally:
        for p in _alive(workers):
            os.kill(p, signal.SIGKILL)
