"""Measured costs for pair economics: the runner times each target pass by tokens verified
and each drafting step, decodes the same prompts plainly, and the model's batch-1
prediction from those step times must agree with the measured speed-up within ±15%.

Both sides come from timings taken in the same run (each prompt decoded speculatively,
then plainly, right after), so load on the shared machine weighs on both alike; no test
here compares a time with a fixed number.
"""

from __future__ import annotations

import pytest

from runner import MeasureSettings, Prompt, measure_pair
from runner.suites import load_suite
from runner.timings import StepTimings, economics_summary


def test_economics_summary_by_hand() -> None:
    spec, plain = StepTimings(), StepTimings()
    spec.add_target(7, 0.5, prefill=True)  # prefill: kept apart
    for _ in range(3):
        spec.add_target(5, 0.012)
        spec.add_draft(4, 0.004)
    spec.add_target(1, 0.01)  # a step with no draft left in the budget
    spec.add_decode(0.1, 10)
    for _ in range(10):
        plain.add_target(1, 0.01)
    plain.add_decode(0.11, 10)
    out = economics_summary(spec, plain, tau=2.5)
    assert out["verify_call_s"] == pytest.approx((3 * 0.012 + 0.01) / 4)
    assert out["draft_step_s"] == pytest.approx(0.012 / 4)
    assert out["tokens_per_verify_pass"] == pytest.approx((3 * 5 + 1) / 4)
    assert out["plain_call_s"] == pytest.approx(0.01)
    # c: 0.004 s per step of 4 drafted tokens = 0.001 s per token, over a 0.01 s pass
    assert out["cost_ratio_c"] == pytest.approx(0.1)
    assert out["speedup_measured"] == pytest.approx(0.011 / 0.01)
    assert out["speedup_predicted"] == pytest.approx(2.5 * 0.01 / (0.0115 + 0.003))
    assert out["spec"]["prefill"] == {"calls": 1, "seconds": 0.5, "tokens": 7}
    assert out["spec"]["target_by_tokens"]["5"]["calls"] == 3
    # without a plain run there is no measured speed-up, only the step costs
    assert "speedup_measured" not in economics_summary(spec, None, tau=2.5)


PAIRS = {
    "draft_model": ("draft", MeasureSettings(method="draft_model", k=4)),
    "prompt_lookup": (None, MeasureSettings(method="prompt_lookup", k=4)),
    "medusa": ("medusa", MeasureSettings(method="medusa", k=3)),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_batch1_prediction_matches_measured_speedup(tiny, name: str) -> None:
    attr, base = PAIRS[name]
    s = MeasureSettings(
        method=base.method, k=base.k, max_new_tokens=48, device="cpu", num_threads=1
    )
    prompts = load_suite("code").prompts[:4]
    drafter = getattr(tiny, attr) if attr else None
    res = measure_pair(tiny.target_v1, drafter, prompts, s)
    e = res.to_dict()["economics"]
    assert e["plain_decode_tokens"] > 0 and e["spec_decode_tokens"] > 0
    # greedy and lossless: the plain run emits what the speculative run emitted
    assert e["plain_decode_tokens"] == e["spec_decode_tokens"]
    # every decoding pass verified 1 + drafted tokens; the table saw them all
    calls = sum(r["calls"] for r in e["spec"]["target_by_tokens"].values())
    counters = res.overall["counters"]
    assert calls == counters["target_calls"] - counters["prefill_calls"]
    assert e["tokens_per_verify_pass"] == pytest.approx(1 + counters["drafted"] / calls, rel=1e-9)
    measured, predicted = e["speedup_measured"], e["speedup_predicted"]
    assert measured > 0 and predicted > 0
    assert abs(predicted / measured - 1) <= 0.15, (name, measured, predicted, e)


def test_no_drafter_no_baseline(tiny) -> None:
    s = MeasureSettings(method="none", k=0, max_new_tokens=8, device="cpu")
    res = measure_pair(tiny.target_v1, None, [Prompt("p", "code", "def f(")], s)
    e = res.to_dict()["economics"]
    # plain decoding: one 1-token pass per token after the first (the prefill emits it)
    assert "speedup_measured" not in e
    assert e["spec"]["target_by_tokens"]["1"]["calls"] == res.prompts[0]["emitted"] - 1
    assert e["spec"]["prefill"]["calls"] == 1 and not e["spec"]["draft_by_tokens"]


def test_mlflow_metrics_carry_the_economics() -> None:
    from runner.mlflow_log import _flatten_metrics, economics_metrics

    spec, plain = StepTimings(), StepTimings()
    spec.add_target(5, 0.02)
    spec.add_draft(4, 0.004)
    spec.add_decode(0.024, 3)
    plain.add_target(1, 0.01)
    plain.add_decode(0.01, 1)
    econ = economics_summary(spec, plain, tau=3.0)
    m = economics_metrics(econ)
    assert m["economics.speedup_measured"] == pytest.approx((0.01 / 1) / (0.024 / 3))
    assert m["economics.target_s.n5"] == pytest.approx(0.02)
    assert m["economics.draft_s.k4"] == pytest.approx(0.004)
    assert "economics.speedup_predicted" in _flatten_metrics({"economics": econ})
