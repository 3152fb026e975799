"""Synthetic governance data: fake model dirs, pairs and per-prompt counters (no runner)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from registry.db import session_scope
from registry.services import artifacts, measurements, pairs, policies
from tests.fixtures import write_fake_model

ACTOR = "tester"

TEST_POLICY = """
name = "test"
[suite]
name = "tiny"
max_new_tokens = 16
[alpha]
min_overall = 0.5
min_per_category = 0.4
max_drop = 0.2
[drift]
margin = 0.05
significance = 0.05
bootstrap = 1000
"""


def add_model(url: str, tmp: Path, name: str, role: str, weights: bytes, **kw: Any) -> int:
    d = write_fake_model(
        tmp / f"{name.replace('/', '_')}-{weights.hex()[:12]}", weights=weights, **kw
    )
    with session_scope(url) as s:
        return artifacts.add_artifact(
            s, source=str(d), name=name, role=role, actor=ACTOR
        ).artifact.id


def make_pair(url: str, target_id: int, draft_id: int, k: int = 4) -> str:
    with session_scope(url) as s:
        res = pairs.register_pair(
            s, target=str(target_id), draft=str(draft_id), method="draft_model", k=k, actor=ACTOR
        )
        return res.pair.pair_digest


def synthetic_result(
    alphas: dict[str, float], n: int = 12, seed: int = 0, tokens: int = 40
) -> dict[str, Any]:
    """Per-prompt counters drawn around a per-category α (binomial accept/reject)."""
    rng = np.random.default_rng(seed)
    prompts = []
    cats: dict[str, Any] = {}
    tot_a = tot_r = 0
    for cat, alpha in alphas.items():
        a_sum = r_sum = 0
        for i in range(n):
            acc = int(rng.binomial(tokens, alpha))
            rej = tokens - acc
            prompts.append(
                {
                    "id": f"{cat}-{i}",
                    "category": cat,
                    "accepted": acc,
                    "rejections": rej,
                    "drafted": tokens + rej,
                    "output_ids": [1, 2],
                }
            )
            a_sum += acc
            r_sum += rej
        cats[cat] = {"alpha": a_sum / (a_sum + r_sum), "prompts": n}
        tot_a += a_sum
        tot_r += r_sum
    return {
        "categories": cats,
        "overall": {"alpha": tot_a / (tot_a + tot_r)},
        "prompts": prompts,
        "hardware": {"device": "cpu"},
    }


def settings_for(url: str, digest: str, policy: str = "test") -> dict[str, Any]:
    from registry.governance.policy import measurement_settings
    from registry.refs import resolve_pair

    with session_scope(url) as s:
        pol = policies.load_policy(s, policy)
        pair = resolve_pair(s, digest)
        return measurement_settings(pair.config, pol.parsed["suite"])


def store(url: str, digest: str, result: dict[str, Any], policy: str = "test") -> int:
    settings = settings_for(url, digest, policy)
    with session_scope(url) as s:
        return measurements.store_measurement(
            s,
            pair=digest,
            suite_name="tiny",
            suite_digest="s" * 64,
            settings=settings,
            runner_version="test-1",
            result=result,
            actor=ACTOR,
        ).id


def put_test_policy(url: str) -> None:
    with session_scope(url) as s:
        policies.put_policy(s, text=TEST_POLICY, actor=ACTOR)
