"""The job queue: idempotent enqueue, leases, retake after expiry, exactly-once results."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from registry.db import session_scope
from registry.errors import Conflict
from registry.services import job_results, jobs, validation
from registry.tables import Job, Measurement
from tests.governance.helpers import (
    ACTOR,
    add_model,
    make_pair,
    put_test_policy,
    store,
    synthetic_result,
)


def _queued(url: str, tmp: Path) -> int:
    put_test_policy(url)
    t = add_model(url, tmp, "acme/target", "target", b"t1")
    d = add_model(url, tmp, "acme/draft", "draft", b"d1")
    digest = make_pair(url, t, d)
    with session_scope(url) as s:
        res = validation.validate_pair(
            s, ref=digest, policy="test", runner_version="r1", suite_digest="s" * 64, actor=ACTOR
        )
        assert res.state == "queued" and res.job is not None
        again = validation.validate_pair(
            s, ref=digest, policy="test", runner_version="r1", suite_digest="s" * 64, actor=ACTOR
        )
        assert again.job is not None and again.job.id == res.job.id  # same job, not a new one
        return res.job.id


def _result() -> dict:
    return {
        "suite_digest": "s" * 64,
        "runner_version": "r1",
        "device": "cpu",
        "result": synthetic_result({"code": 0.8, "prose": 0.7}),
    }


def test_lease_expiry_retake_and_exactly_once(db_url: str, tmp_path: Path) -> None:
    job_id = _queued(db_url, tmp_path)
    with session_scope(db_url) as s:
        a = jobs.claim_job(s, worker="A", lease_seconds=1, actor=ACTOR)
        assert a is not None and a.id == job_id and a.attempts == 1
    with session_scope(db_url) as s:
        assert jobs.claim_job(s, worker="B", actor=ACTOR) is None  # A holds the lease
    time.sleep(1.2)
    with session_scope(db_url) as s:
        b = jobs.claim_job(s, worker="B", lease_seconds=30, actor=ACTOR)
        assert b is not None and b.id == job_id and b.attempts == 2
    with pytest.raises(Conflict, match="lease was lost"), session_scope(db_url) as s:
        job_results.complete_job(s, id=job_id, worker="A", result=_result(), actor=ACTOR)
    with session_scope(db_url) as s:
        done = job_results.complete_job(s, id=job_id, worker="B", result=_result(), actor=ACTOR)
        assert done.state == "done" and done.result and done.result["passed"] is True
    with session_scope(db_url) as s:  # a late duplicate is ignored, not stored twice
        again = job_results.complete_job(s, id=job_id, worker="B", result=_result(), actor=ACTOR)
        assert again.result == done.result
        assert s.query(Measurement).filter(Measurement.job_id == job_id).count() == 1


def test_failing_job_is_retried_then_failed(db_url: str, tmp_path: Path) -> None:
    job_id = _queued(db_url, tmp_path)
    for attempt in range(1, 4):
        with session_scope(db_url) as s:
            j = jobs.claim_job(s, worker="W", actor=ACTOR)
            assert j is not None and j.attempts == attempt
            out = jobs.fail_job(s, id=job_id, worker="W", error=f"boom {attempt}", actor=ACTOR)
        assert out.state == ("failed" if attempt == 3 else "queued")
    with session_scope(db_url) as s:
        assert jobs.claim_job(s, worker="W", actor=ACTOR) is None
        job = s.get(Job, job_id)
        assert job is not None and job.state == "failed" and job.error == "boom 3"
        listed = jobs.list_jobs(s, state="failed")
        assert [j.id for j in listed.items] == [job_id]


def test_validation_reuses_what_the_measuring_workers_would_reproduce(
    db_url: str, tmp_path: Path
) -> None:
    """Without a caller's runner version, reuse follows the workers taking jobs: none known
    → queue; a live worker on another runner version → queue; one on the measurement's
    version → reuse."""
    put_test_policy(db_url)
    t = add_model(db_url, tmp_path, "acme/target", "target", b"t1")
    d = add_model(db_url, tmp_path, "acme/draft", "draft", b"d1")
    digest = make_pair(db_url, t, d)
    store(db_url, digest, synthetic_result({"code": 0.8, "prose": 0.7}))  # runner test-1

    def validate() -> str:
        with session_scope(db_url) as s:
            return validation.validate_pair(s, ref=digest, policy="test", actor=ACTOR).state

    assert validate() == "queued"  # no worker has ever reported a version
    with session_scope(db_url) as s:
        jobs.claim_job(s, worker="gpu-1", runner_version="test-2", kinds=["none"], actor=ACTOR)
    assert validate() == "queued"  # the live worker would measure with another runner
    with session_scope(db_url) as s:
        jobs.claim_job(s, worker="gpu-2", runner_version="test-1", kinds=["none"], actor=ACTOR)
        assert jobs.measuring_runner_versions(s, None) == ["test-1", "test-2"]
    assert validate() == "done"
