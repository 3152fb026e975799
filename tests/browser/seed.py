"""A seeded registry for the dashboard: one deployment with a history, measurements over
time, a target change with its drift flag, and served requests (synthetic, no runner).

The counts the browser tests expect (series, points, markers) are read back from this
module's constants, so a change to the seed and a change to the page cannot both go
unnoticed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update

from registry.db import session_scope
from registry.services import deployments, drift, requests, transparency, validation
from registry.tables import Measurement, utcnow
from tests.governance.helpers import (
    ACTOR,
    add_model,
    make_pair,
    put_test_policy,
    store,
    synthetic_result,
)

DEPLOYMENT = "prod"
CATEGORIES = ("code", "prose")
# α per category of the live pair, re-measured three times (days ago), then the candidate
# on the new target version, whose code α drops enough to open a drift flag.
LIVE_ALPHAS = (
    {"code": 0.80, "prose": 0.70},
    {"code": 0.78, "prose": 0.71},
    {"code": 0.81, "prose": 0.69},
)
CANDIDATE_ALPHA = {"code": 0.45, "prose": 0.69}
DAYS_AGO = (6, 4, 2)
REQUESTS = 5


K = 4


def _result(alphas: dict[str, float], seed: int) -> dict:
    """Synthetic per-prompt counters plus the per-category statistics a runner reports
    (interval, τ, per-position acceptance), so every panel has something to draw."""
    out = synthetic_result(alphas, seed=seed)
    for stats in out["categories"].values():
        a = stats["alpha"]
        half = 1.96 * math.sqrt(a * (1 - a) / (stats["prompts"] * 40))
        stats["alpha_ci"] = [a - half, a + half]
        stats["tau"] = (1 - a ** (K + 1)) / (1 - a)
        stats["expected_alpha"] = a + 0.02
        stats["per_position"] = [a ** (i + 1) for i in range(K)]
    return out


@dataclass
class Seeded:
    live_digest: str
    other_digest: str
    candidate_digest: str
    flag_id: int
    request_ids: list[str]
    measurements: int  # on the deployment's chart (live + candidate)


def seed(url: str, tmp: Path, key_path: Path) -> Seeded:
    put_test_policy(url)
    t1 = add_model(url, tmp, "acme/target", "target", b"t1")
    d1 = add_model(
        url,
        tmp,
        "acme/draft",
        "draft",
        b"d1",
    )
    d2 = add_model(url, tmp, "acme/draft", "draft", b"d2")
    live = make_pair(url, t1, d1)
    other = make_pair(url, t1, d2)
    ids = []
    for i, alphas in enumerate(LIVE_ALPHAS):
        ids.append(store(url, live, _result(alphas, seed=10 + i)))
    store(url, other, _result({"code": 0.75, "prose": 0.66}, seed=3))
    now = utcnow()
    with session_scope(url) as s:
        for mid, days in zip(ids, DAYS_AGO, strict=True):
            s.execute(
                update(Measurement)
                .where(Measurement.id == mid)
                .values(created_at=now - timedelta(days=days))
            )
        deployments.create_deployment(s, name=DEPLOYMENT, policy="test", actor=ACTOR)
    for digest in (other, live):
        with session_scope(url) as s:
            res = validation.validate_pair(
                s, ref=digest, policy="test", runner_version="test-1", actor=ACTOR
            )
            assert res.validation is not None and res.validation.passed, res
    with session_scope(url) as s:
        deployments.promote(
            s, ref=other, deployment=DEPLOYMENT, reason="first release", actor="alice"
        )
    with session_scope(url) as s:
        deployments.promote(
            s, ref=live, deployment=DEPLOYMENT, reason="draft v1 accepts more", actor="bob"
        )
    # The target moves: a new version in its lineage; the candidate pair is measured.
    t2 = add_model(url, tmp, "acme/target", "target", b"t2")
    candidate = make_pair(url, t2, d1)
    cand_m = store(url, candidate, _result(CANDIDATE_ALPHA, seed=20))
    with session_scope(url) as s:
        out = drift.check_drift(
            s,
            candidate=candidate,
            baseline_measurement=ids[-1],
            candidate_measurement=cand_m,
            policy="test",
            actor=ACTOR,
        )
        assert out.flag is not None, out.effects
        flag_id = out.flag.id
    served = utcnow()
    request_ids = [f"req-{i}" for i in range(REQUESTS)]
    tags = [
        {
            "request_id": rid,
            "deployment": DEPLOYMENT,
            "served_at": served,
            "input_tokens": 10 + i,
            "output_tokens": 30 + i,
            "spec": {
                "num_spec_steps": 8,
                "num_draft_tokens": 32,
                "num_accepted_draft_tokens": 24 - i,
            },
        }
        for i, rid in enumerate(request_ids)
    ]
    with session_scope(url) as s:
        requests.ingest_requests(s, tags=tags, actor="token:ingest")
    with session_scope(url) as s:
        transparency.sign_log_checkpoint(s, key_path=str(key_path), actor=ACTOR)
    return Seeded(live, other, candidate, flag_id, request_ids, len(LIVE_ALPHAS) + 1)
