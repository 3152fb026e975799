"""Two ``pairreg serve`` processes on one PostgreSQL database, writing and signing
checkpoints at the same time, keep one consistent audit log: every event lands once, at one
leaf of a gapless tree, the tree verifies, every signed checkpoint is consistent with the
log, and the sizes add up. Writers are not serialised by a log lock: two transactions hold
uncommitted events at once while the servers write, and the servers' sequencers integrate
everything without being asked."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select, text

from registry.db import session_scope
from registry.services import transparency as tl
from registry.services.system import read_credentials
from registry.settings import Settings
from registry.tables import AuditEvent, AuditLeaf, AuditPending, LogCheckpoint
from registry.trust import audit
from tests.serve_process import ApiServer

THREADS = 3
WRITES = 8


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_two_servers_on_one_database_keep_one_log(home: Settings, tmp_path: Path) -> None:
    url = home.db_url
    creds = read_credentials(home.credentials_path)
    assert creds
    auth = {"Authorization": f"Bearer {creds['token']}"}
    with session_scope(url) as s:
        start = tl.verify_audit_log(s).tree_size
    servers = [ApiServer(url, home.home_dir, env={"PAIRREG_HOME": str(home.home_dir)})]
    servers.append(ApiServer(url, home.home_dir, env={"PAIRREG_HOME": str(home.home_dir)}))
    errors: list[str] = []
    sizes: list[int] = []
    try:
        for server in servers:
            server.start()
        barrier = threading.Barrier(len(servers) * THREADS)

        def writer(n: int, server: ApiServer) -> None:
            with httpx.Client(base_url=server.url, headers=auth, timeout=60) as c:
                barrier.wait()
                for i in range(WRITES):
                    r = c.post("/v1/tokens", json={"name": f"s{n}-{i}", "role": "reader"})
                    if r.status_code != 201:
                        errors.append(f"{n}/{i}: {r.status_code} {r.text}")
                    if i % 3 == 2:  # checkpoints signed by both servers while others write
                        cp = c.post("/v1/audit/log-checkpoints")
                        if cp.status_code != 200:
                            errors.append(f"checkpoint {n}/{i}: {cp.status_code} {cp.text}")
                        else:
                            sizes.append(cp.json()["tree_size"])

        threads = [
            threading.Thread(target=writer, args=(k * THREADS + t, server))
            for k, server in enumerate(servers)
            for t in range(THREADS)
        ]
        for t in threads:
            t.start()
        held = _two_open_transactions(url)
        for t in threads:
            t.join(120)
        assert errors == []
        assert held == 2
        # Nobody reads the tree now: the servers' sequencer threads integrate what is left.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with session_scope(url) as s:
                pending = s.scalar(select(func.count()).select_from(AuditPending))
            if pending == 0:
                break
            time.sleep(0.2)
        assert pending == 0
        verdicts = [
            httpx.get(f"{s.url}/v1/audit/verify", headers=auth, timeout=60).json() for s in servers
        ]
    finally:
        for server in servers:
            server.stop()
    writes = len(servers) * THREADS * WRITES
    assert verdicts[0] == verdicts[1]
    v = verdicts[0]
    assert v["ok"] is True and v["signed_ok"] is True, v
    # one token.created event per write, plus the two held transactions' events
    assert v["tree_size"] == start + writes + 2
    assert len(sizes) == len(servers) * THREADS * (WRITES // 3)
    assert v["signed_size"] == max(sizes) and all(start < n <= v["tree_size"] for n in sizes)
    with session_scope(url) as s:
        seqs = list(s.scalars(select(AuditEvent.seq).order_by(AuditEvent.seq)))
        leaves = list(s.scalars(select(AuditLeaf.idx).order_by(AuditLeaf.idx)))
        leafed = sorted(s.scalars(select(AuditLeaf.seq)))
        actions = list(s.scalars(select(AuditEvent.action).where(AuditEvent.seq > start)))
        signed = list(s.scalars(select(LogCheckpoint.tree_size)))
    assert len(seqs) == start + writes + 2 and leafed == seqs  # every event at one leaf
    assert leaves == list(range(start + writes + 2))  # a gapless tree
    assert sorted(actions) == sorted(["token.created"] * writes + ["test.held"] * 2)
    assert set(sizes) == set(signed)  # every checkpoint a server returned is the one stored


def _two_open_transactions(url: str) -> int:
    """Two transactions each append an event and stay open at the same time, while the
    servers write (a log-wide lock would make the second wait for the first: the lock
    timeout fails it); they commit in the reverse order. Returns how many committed."""
    both_written = threading.Barrier(2, timeout=30)
    done: list[int] = []

    def hold(name: str, delay: float) -> None:
        with session_scope(url) as s:
            s.execute(text("SET LOCAL lock_timeout = '5s'"))
            audit.append_event(
                s,
                actor="test:held",
                action="test.held",
                entity_type="test",
                entity_id=name,
                payload={"name": name},
            )
            both_written.wait()  # both uncommitted events exist now
            time.sleep(delay)
        done.append(1)

    threads = [
        threading.Thread(target=hold, args=("first", 0.6)),
        threading.Thread(target=hold, args=("second", 0.1)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return len(done)
