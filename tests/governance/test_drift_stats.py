"""Paired drift statistics on synthetic per-prompt counters (no runner)."""

from __future__ import annotations

import numpy as np

from registry.stats.drift import drift_test, holm, paired_effect, severity
from tests.governance.helpers import synthetic_result


def test_identical_measurements_are_not_drift() -> None:
    r = synthetic_result({"code": 0.7, "prose": 0.6}, seed=3)["prompts"]
    effects = drift_test(r, r, margin=0.05, significance=0.05, n_boot=500)
    for e in effects.values():
        assert e.diff == 0.0 and e.p_value == 1.0 and not e.drifted


def test_large_drop_in_one_category_is_flagged_with_interval() -> None:
    base = synthetic_result({"code": 0.8, "prose": 0.6}, n=12, seed=1)["prompts"]
    cand = synthetic_result({"code": 0.5, "prose": 0.6}, n=12, seed=2)["prompts"]
    effects = drift_test(base, cand, margin=0.05, significance=0.05, n_boot=1000)
    code = effects["code"]
    assert code.drifted and code.significant and code.exceeds_margin
    assert code.ci_low is not None and code.ci_high is not None
    assert code.ci_low <= code.diff <= code.ci_high < 0
    assert code.p_holm is not None and code.p_holm >= code.p_value  # type: ignore[operator]
    assert not effects["prose"].drifted
    assert severity(effects, 0.05) == "high"


def test_small_significant_drop_below_margin_is_not_drift() -> None:
    base = [(90.0, 10.0)] * 30
    cand = [(88.0, 12.0)] * 30
    e = paired_effect(base, cand, n_boot=500)
    assert e.diff is not None and -0.03 < e.diff < 0
    assert e.p_value is not None and e.p_value < 0.01
    prompts_b = [
        {"id": str(i), "category": "c", "accepted": a, "rejections": r}
        for i, (a, r) in enumerate(base)
    ]
    prompts_c = [
        {"id": str(i), "category": "c", "accepted": a, "rejections": r}
        for i, (a, r) in enumerate(cand)
    ]
    out = drift_test(prompts_b, prompts_c, margin=0.05, significance=0.05, n_boot=500)
    assert out["c"].significant and not out["c"].exceeds_margin and not out["c"].drifted


def test_holm_is_monotone_and_capped() -> None:
    adj = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    assert adj["a"] == 0.03  # 3 * 0.01
    assert adj["c"] == 0.06  # max(0.03, 2 * 0.03)
    assert adj["b"] == 0.06  # max(0.06, 1 * 0.04)
    assert adj["d"] is None
    assert holm({"x": 0.9, "y": 0.8})["x"] == 1.0


def test_false_flag_rate_within_significance_synthetic() -> None:
    """Unchanged pair, new random draw each time: flags stay within the level."""
    rng = np.random.default_rng(7)
    flags = 0
    runs = 200
    for _ in range(runs):
        alphas = {"code": 0.75, "prose": 0.6, "sql": 0.7}
        seed_a, seed_b = rng.integers(0, 2**31, size=2)
        a = synthetic_result(alphas, n=10, seed=int(seed_a))["prompts"]
        b = synthetic_result(alphas, n=10, seed=int(seed_b))["prompts"]
        # margin 0 makes every significant drop count: the pure type-I error rate
        eff = drift_test(a, b, margin=0.0, significance=0.05, n_boot=300, seed=int(seed_b))
        flags += any(e.drifted for e in eff.values())
    assert flags / runs <= 0.05 + 0.03, flags
