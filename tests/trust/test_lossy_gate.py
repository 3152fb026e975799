"""The lossy-variant gate, exercised end to end on the tiny pair and the shipped adversarial
suite: a typical-acceptance pair leaves the target's own greedy output early, a strict
prefix keeps the first N tokens exactly greedy, and ``lossy.adversarial`` passes and refuses
as the policy says. Medusa's typical-acceptance parameters are given explicitly (threshold
ε = 0.09, α = 0.3): this test must not depend on anyone's defaults."""

from __future__ import annotations

from typing import Any

import pytest

from registry.db import session_scope
from registry.governance.policy import measurement_settings
from registry.services import artifacts, measurements, pairs, policies, validation

pytestmark = pytest.mark.slow

FIRST = 8  # the gate's first_tokens
PROMPTS = 8
TYPICAL = {"acceptance": "typical", "typical_epsilon": 0.09, "typical_delta": 0.3}
SUITE = f"""
[suite]
name = "default"
categories = ["adversarial"]
prompts_per_category = {PROMPTS}
max_new_tokens = 12
temperature = 0.0
[alpha]
min_overall = 0.0
min_per_category = 0.0
[drafter]
declared_target_must_match = false
"""


def policy(name: str, allowed: bool, max_rate: float) -> str:
    return (
        f'name = "{name}"\n{SUITE}[lossy]\nallowed = {str(allowed).lower()}\n'
        f'adversarial_categories = ["adversarial"]\nfirst_tokens = {FIRST}\n'
        f"max_divergence_rate = {max_rate}\n"
    )


def test_strict_prefix_lowers_divergence_and_the_gate_follows_policy(
    sqlite_url: str, tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from registry.jobloop import MeasureTask
    from runner.executor import RunnerExecutor  # what workers and `pairreg measure` run

    monkeypatch.setenv("PAIRREG_MLFLOW", "0")
    url = sqlite_url
    with session_scope(url) as s:
        t = artifacts.add_artifact(
            s, source=str(tiny.target_v1), name="tiny/t", role="target", actor="test"
        ).artifact
        d = artifacts.add_artifact(
            s, source=str(tiny.draft), name="tiny/d", role="draft", actor="test"
        ).artifact
        for name, allowed, rate in (
            ("strict-gate", True, 0.0),
            ("loose-gate", True, 1.0),
            ("lossless-only", False, 0.0),
        ):
            policies.put_policy(s, text=policy(name, allowed, rate), actor="test")
        suite = policies.load_policy(s, "strict-gate").parsed["suite"]
        made = {
            prefix: pairs.register_pair(
                s,
                target=t.ref,
                draft=d.ref,
                method="draft_model",
                k=4,
                options={**TYPICAL, "strict_prefix_tokens": prefix},
                actor="test",
            ).pair
            for prefix in (0, FIRST)
        }

    rates: dict[int, tuple[int, int]] = {}
    version = ""
    for prefix, pair in made.items():
        settings = measurement_settings(pair.config, suite)
        task = MeasureTask(
            pair_digest=pair.pair_digest,
            lossy=pair.lossy,
            settings=settings,
            suite_name="default",
            categories=["adversarial"],
            prompts_per_category=PROMPTS,
            target_dir=str(tiny.target_v1),
            drafter_dir=str(tiny.draft),
            device="cpu",
            divergence_categories=["adversarial"],
        )
        out = RunnerExecutor(log_runs=False).measure(task)
        rows = out["result"]["prompts"]
        version = out["runner_version"]
        assert len(rows) == PROMPTS and all("divergence_at" in r for r in rows)
        rates[prefix] = (
            sum(1 for r in rows if r["divergence_at"] is not None and r["divergence_at"] < FIRST),
            len(rows),
        )
        with session_scope(url) as s:
            measurements.store_measurement(
                s,
                pair=pair.pair_digest,
                suite_name="default",
                suite_digest=out["suite_digest"],
                settings=settings,
                runner_version=out["runner_version"],
                result=out["result"],
                actor="test",
            )
    # Typical acceptance leaves greedy on some adversarial prompts within the first tokens
    # (how many depends on the build: 5 of 8 and 1 of 8 seen); verifying the first FIRST
    # tokens strictly makes them exactly greedy (fp32).
    assert rates[0][0] >= 1, rates
    assert rates[FIRST] == (0, PROMPTS)

    def gates(prefix: int, name: str) -> dict[str, Any]:
        with session_scope(url) as s:
            res = validation.validate_pair(
                s, ref=made[prefix].pair_digest, policy=name, runner_version=version, actor="test"
            )
        assert res.validation is not None, "the stored measurement must be reused"
        return {g.name: g for g in res.validation.gates}

    strict_lossy, strict_prefixed = gates(0, "strict-gate"), gates(FIRST, "strict-gate")
    gate = strict_lossy["lossy.adversarial"]
    assert not gate.passed
    assert gate.measured == f"{rates[0][0] / PROMPTS:.4f} ({rates[0][0]}/{PROMPTS})"
    assert gate.required == f"<= 0.0000 diverging in first {FIRST} tokens"
    assert strict_prefixed["lossy.adversarial"].passed
    assert strict_prefixed["lossy.adversarial"].measured == f"0.0000 (0/{PROMPTS})"
    assert gates(0, "loose-gate")["lossy.adversarial"].passed
    lossless = gates(FIRST, "lossless-only")
    assert not lossless["lossless"].passed and "lossy.adversarial" not in lossless
