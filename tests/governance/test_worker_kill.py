"""SIGKILL a worker mid-job, on SQLite and on PostgreSQL; a second worker takes the job after the
lease expires, and the job's results are written exactly once (retried once, completed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from registry.db import session_scope
from registry.tables import AuditEvent, Job, Measurement, utcnow
from tests.governance.conftest import POLICY
from tests.governance.test_flow import _register

pytestmark = pytest.mark.slow
PAIRREG = str(Path(sys.executable).with_name("pairreg"))


def _job(url: str, job_id: int) -> Job:
    with session_scope(url) as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _worker(env: dict[str, str], lease: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [PAIRREG, "worker", "--once", "--lease", str(lease)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_killed_worker_job_completes_once(home, cli, tiny) -> None:  # type: ignore[no-untyped-def]
    url = home.db_url
    digest = _register(cli, tiny.target_v1, tiny.draft)
    assert cli("policy", "put", str(POLICY)).rc == 0
    r = cli("validate", digest, "--policy", "tiny", "--no-wait", "--json")
    assert r.rc == 3, r.out + r.err
    job_id = r.json()["job"]["id"]
    env = {**os.environ, "PAIRREG_MLFLOW": "0"}

    first = _worker(env, lease=3)
    deadline = time.monotonic() + 120
    while _job(url, job_id).state != "running":
        assert first.poll() is None and time.monotonic() < deadline, "worker never claimed"
        time.sleep(0.2)
    time.sleep(1.0)  # inside the job: importing the runner, loading models, measuring
    assert _job(url, job_id).state == "running"
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    killed = _job(url, job_id)
    assert killed.state == "running" and killed.attempts == 1
    assert killed.lease_expires_at is not None
    while utcnow() <= killed.lease_expires_at:
        time.sleep(0.2)

    second = _worker(env, lease=30)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out.decode()
    done = _job(url, job_id)
    assert done.state == "done" and done.attempts == 2, out.decode()
    assert done.lease_owner != killed.lease_owner
    with session_scope(url) as s:
        stored = s.scalar(
            select(func.count()).select_from(Measurement).where(Measurement.job_id == job_id)
        )
        done_events = s.scalar(
            select(func.count()).select_from(AuditEvent).where(AuditEvent.action == "job.done")
        )
    assert stored == 1 and done_events == 1
    assert done.result is not None and done.result["passed"] is True
