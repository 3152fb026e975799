"""Reads are not queued behind writes (api/lanes.py).

The load benchmark found look-ups waiting hundreds of milliseconds behind writes: every
write held one of the shared 40 worker threads and a pooled connection while it waited on
the registry's write lock, so a look-up found neither. Writes now run in a lane of their
own, bounded, and wait for it without a thread or a connection."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from api.lanes import Lane, Lanes
from registry import db
from registry.db import get_engine, session_scope
from registry.settings import Settings
from registry.trust.audit import _PG_WRITE_LOCK
from registry.trust.audit_tree import verify_tree
from tests.serve_process import ApiServer, mint


def test_lane_bounds_its_threads_and_leaves_the_other_lane_free() -> None:
    lanes = Lanes(read=Lane("read", 3), write=Lane("write", 2))
    release = threading.Event()

    def blocked_write() -> str:
        assert release.wait(10)
        return "written"

    async def scenario() -> None:
        writes = [asyncio.create_task(lanes.write.run(blocked_write)) for _ in range(10)]
        for _ in range(200):  # until both threads of the write lane are taken
            await asyncio.sleep(0.01)
            if lanes.write.running == 2:
                break
        await asyncio.sleep(0.05)
        assert lanes.write.running == 2, "the write lane runs at most its size"
        assert lanes.write.waiting == 8, "the rest wait in the event loop, not in threads"
        # a read gets a thread at once although every write thread is blocked
        assert await asyncio.wait_for(lanes.read.run(lambda: "read"), 5) == "read"
        release.set()
        assert await asyncio.gather(*writes) == ["written"] * 10
        assert lanes.write.peak == 2 and lanes.write.running == 0

    asyncio.run(scenario())


def test_lanes_follow_the_operation_kind() -> None:
    lanes = Lanes.from_settings(Settings(read_concurrency=5, write_concurrency=3))
    assert (lanes.read.size, lanes.write.size) == (5, 3)
    assert lanes.for_method("GET") is lanes.read
    for method in ("POST", "PUT", "DELETE"):
        assert lanes.for_method(method) is lanes.write
    assert lanes.write.pool is None  # writes on threads by default
    pooled = Lanes.from_settings(Settings(write_processes=2, write_nice=7))
    assert pooled.write.pool is not None and pooled.read.pool is None
    assert (pooled.write.pool.processes, pooled.write.pool.nice) == (2, 7)
    pooled.close()  # never started: nothing to stop


WRITES = 48  # more than Starlette's 40 shared threads and the 30 pooled connections


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
@pytest.mark.parametrize("processes", ["0", "2"], ids=["write-threads", "write-processes"])
def test_reads_answer_while_writes_wait_on_the_write_lock(
    db_url: str, tmp_path: Path, processes: str
) -> None:
    """Hold the registry's write lock from outside, send 48 writes at once to a real
    ``pairreg serve``: they all wait. Reads must still answer at once (before the lanes,
    they waited for a thread until the lock was let go). Then every write completes, once,
    and the audit log verifies; with the writes on threads and in worker processes."""
    env = {"PAIRREG_WRITE_CONCURRENCY": "2", "PAIRREG_WRITE_PROCESSES": processes}
    server = ApiServer(db_url, tmp_path / "home", env=env)
    server.start()
    admin = mint(db_url, role="admin", name="lanes-admin")
    headers = {"Authorization": f"Bearer {admin}"}
    db.dispose_engines()
    blocker = get_engine(db_url).connect()
    blocker.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_WRITE_LOCK})
    locked = True

    async def scenario() -> tuple[list[int], list[float]]:
        limits = httpx.Limits(max_connections=WRITES + 4)
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, limits=limits, timeout=60
        ) as http:
            writes = [
                asyncio.create_task(
                    http.post("/v1/tokens", json={"name": f"w{i:02d}", "role": "reader"})
                )
                for i in range(WRITES)
            ]
            await asyncio.sleep(1.5)  # every write has arrived and is waiting on the lock
            assert not any(w.done() for w in writes), "the writes should wait on the lock"
            took = []
            for path in ("/v1/pairs", "/v1/tokens", "/v1/audit/events", "/v1/whoami"):
                t0 = time.perf_counter()
                resp = await http.get(path, timeout=10)
                took.append(time.perf_counter() - t0)
                assert resp.status_code == 200, resp.text
            assert not any(w.done() for w in writes), "the lock is still held"
            nonlocal locked
            blocker.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_WRITE_LOCK})
            blocker.commit()
            locked = False
            return [(await w).status_code for w in writes], took

    try:
        statuses, took = asyncio.run(scenario())
    finally:
        if locked:
            blocker.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_WRITE_LOCK})
        blocker.close()
        server.stop()
    assert max(took) < 5, f"reads waited behind the writes: {took}"
    assert statuses == [201] * WRITES
    with session_scope(db_url) as s:
        names = s.execute(text("SELECT name FROM api_tokens WHERE name LIKE 'w%'")).scalars()
        assert sorted(names) == [f"w{i:02d}" for i in range(WRITES)]
        assert verify_tree(s).ok


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_warm_pool_keeps_the_lanes_connections_open(db_url: str) -> None:
    """`pairreg serve` opens the lanes' connections before taking load, and the pool keeps
    them (with 10 kept, connections past the tenth were opened and closed under load)."""
    db.dispose_engines()
    assert db.warm_pool(db_url, 20) == 20
    assert get_engine(db_url).pool.checkedin() == 20  # type: ignore[attr-defined]
    db.dispose_engines()
