"""scipy's bootstrap and permutation test give the figures the hand-written drift code gave.

The earlier implementation (numpy, written out by hand) is kept below as the oracle. Both run
on the same synthetic categories (small n, n = 1 and 2, ties, zero differences, prompts where
nothing was verified, one category) and must agree within Monte-Carlo error:

* p-value: both sides estimate the same permutation p from ``B`` random arrangements (scipy
  enumerates all ``2**n`` when ``B >= 2**n``, which only removes its error), each with
  standard deviation at most ``sqrt(p (1 - p) / B)``. Allowed: ``5 * sqrt(2 v / B)`` plus
  ``1 / (B + 1)`` for the observed arrangement the randomised estimate counts once, with
  ``v`` the largest ``p (1 - p)`` between the two estimates.
* interval endpoints: compared on the probability scale, where the Monte-Carlo error of an
  empirical quantile does not depend on the shape of the distribution. The new lower end
  must lie between the oracle's bootstrap quantiles at ``0.025 ± t``, the upper end at
  ``0.975 ± t``, ``t = 5 * sqrt(2 * 0.025 * 0.975 / B)`` (two independent estimates,
  5 standard deviations).

With ``B = 20_000`` that is ``t = 0.0078`` and, at p = 0.05, a p-value tolerance of 0.011.
Five standard deviations keep the chance of a spurious failure across all comparisons here
below 1e-4. Holm is the same step-down procedure on both sides and must agree exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest

from registry.stats.drift import SEED, drift_test, holm, paired_effect

B = 20_000
Z = 5.0
T_Q = Z * math.sqrt(2 * 0.025 * 0.975 / B)


# ---- the oracle: the hand-written implementation this module had before scipy -------------


def _alpha_ref(acc: np.ndarray, rej: np.ndarray) -> np.ndarray:
    num = acc.sum(axis=-1)
    den = num + rej.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def reference_effect(
    base: list[tuple[float, float]], cand: list[tuple[float, float]], n_boot: int, seed: int
) -> tuple[float, float | None, float | None, float, np.ndarray]:
    """diff, CI low, CI high, p-value and the bootstrap distribution, as computed before."""
    n = len(base)
    b = np.asarray(base, dtype=float).reshape(n, 2)
    c = np.asarray(cand, dtype=float).reshape(n, 2)
    diff = float(_alpha_ref(c[:, 0], c[:, 1]) - _alpha_ref(b[:, 0], b[:, 1]))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    boot = _alpha_ref(c[idx, 0], c[idx, 1]) - _alpha_ref(b[idx, 0], b[idx, 1])
    boot = boot[~np.isnan(boot)]
    lo, hi = (
        (float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975)))
        if boot.size
        else (None, None)
    )
    swap = rng.random((n_boot, n)) < 0.5
    acc_c = np.where(swap, b[:, 0], c[:, 0])
    rej_c = np.where(swap, b[:, 1], c[:, 1])
    acc_b = np.where(swap, c[:, 0], b[:, 0])
    rej_b = np.where(swap, c[:, 1], b[:, 1])
    perm = _alpha_ref(acc_c, rej_c) - _alpha_ref(acc_b, rej_b)
    p = float((1 + np.sum(perm <= diff + 1e-12)) / (1 + perm.size))
    return diff, lo, hi, min(p, 1.0), boot


def reference_holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    items = sorted(((p, k) for k, p in p_values.items() if p is not None))
    m = len(items)
    out: dict[str, float | None] = {k: None for k, p in p_values.items() if p is None}
    running = 0.0
    for i, (p, k) in enumerate(items):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


# ---- synthetic categories ----------------------------------------------------------------


def _binomial(n: int, a_base: float, a_cand: float, seed: int, tokens: int = 40) -> tuple:
    rng = np.random.default_rng(seed)
    tot = rng.integers(tokens // 2, tokens + 1, n)
    acc_b, acc_c = rng.binomial(tot, a_base), rng.binomial(tot, a_cand)
    base = [(float(a), float(t - a)) for a, t in zip(acc_b, tot, strict=True)]
    cand = [(float(a), float(t - a)) for a, t in zip(acc_c, tot, strict=True)]
    return base, cand


def _datasets() -> dict[str, tuple[list[tuple[float, float]], list[tuple[float, float]]]]:
    rng = np.random.default_rng(11)
    sets: dict[str, tuple[list[tuple[float, float]], list[tuple[float, float]]]] = {
        "drop_n12": _binomial(12, 0.75, 0.6, 1),
        "no_change_n30": _binomial(30, 0.7, 0.7, 2),
        "small_drop_n40": _binomial(40, 0.7, 0.67, 3),
        "n5": _binomial(5, 0.8, 0.6, 4),
        "n3": _binomial(3, 0.8, 0.6, 5),
        "n2": ([(10.0, 4.0), (16.0, 2.0)], [(11.0, 3.0), (4.0, 14.0)]),
        "n1": ([(9.0, 3.0)], [(6.0, 6.0)]),
    }
    # ties: ten tokens a prompt, acceptance in {8, 9, 10}: many identical prompts and pairs
    tb = [(float(a), 10.0 - a) for a in rng.choice([8, 9, 10], 20)]
    tc = [(float(a), 10.0 - a) for a in rng.choice([7, 8, 9, 10], 20)]
    sets["ties_n20"] = (tb, tc)
    base, _ = _binomial(15, 0.7, 0.7, 6)
    sets["zero_differences_n15"] = (base, list(base))
    base, cand = _binomial(16, 0.75, 0.55, 7)
    sets["half_unchanged_n16"] = (base, base[:8] + cand[8:])
    # prompts where nothing was verified: resamples made only of them have no α
    sets["unverified_n4"] = ([(0.0, 0.0), (0.0, 0.0), (7.0, 3.0), (0.0, 0.0)],
                             [(0.0, 0.0), (5.0, 5.0), (4.0, 6.0), (0.0, 0.0)])  # fmt: skip
    return sets


DATASETS = _datasets()


def _p_tolerance(p_old: float, p_new: float) -> float:
    lo, hi = sorted((p_old, p_new))
    v = 0.25 if lo <= 0.5 <= hi else max(lo * (1 - lo), hi * (1 - hi))
    return Z * math.sqrt(2 * v / B) + 1 / (B + 1)


def _quantile_band(dist: np.ndarray, level: float) -> tuple[float, float]:
    lo_q, hi_q = max(level - T_Q, 0.0), min(level + T_Q, 1.0)
    return float(np.quantile(dist, lo_q)) - 1e-12, float(np.quantile(dist, hi_q)) + 1e-12


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_scipy_matches_hand_written_within_monte_carlo_error(name: str) -> None:
    base, cand = DATASETS[name]
    # independent random numbers on the two sides: a genuine Monte-Carlo comparison
    diff, lo, hi, p, boot = reference_effect(base, cand, B, seed=SEED + 1)
    e = paired_effect(base, cand, n_boot=B, seed=SEED)
    assert e.diff == pytest.approx(diff, abs=1e-15)
    assert e.p_value is not None
    assert abs(e.p_value - p) <= _p_tolerance(p, e.p_value), (e.p_value, p)
    assert lo is not None and hi is not None and e.ci_low is not None and e.ci_high is not None
    band_lo, band_hi = _quantile_band(boot, 0.025), _quantile_band(boot, 0.975)
    assert band_lo[0] <= e.ci_low <= band_lo[1], (e.ci_low, band_lo)
    assert band_hi[0] <= e.ci_high <= band_hi[1], (e.ci_high, band_hi)


def test_special_cases_are_exact() -> None:
    base, cand = DATASETS["zero_differences_n15"]
    e = paired_effect(base, cand, n_boot=500)
    assert (e.diff, e.ci_low, e.ci_high, e.p_value) == (0.0, 0.0, 0.0, 1.0)
    one = paired_effect(*DATASETS["n1"], n_boot=500)
    assert one.diff == one.ci_low == one.ci_high == pytest.approx(-0.25)
    assert one.p_value == 0.5  # two arrangements: the drop and its mirror
    # 2**12 arrangements fit in 5000 resamples: scipy enumerates them, the seed is irrelevant
    a = paired_effect(*DATASETS["drop_n12"], n_boot=5000, seed=1)
    b = paired_effect(*DATASETS["drop_n12"], n_boot=5000, seed=2)
    assert a.p_value == b.p_value and a.p_value is not None
    assert (a.p_value * 2**12) == pytest.approx(round(a.p_value * 2**12))


@pytest.mark.parametrize("name", ["drop_n12", "small_drop_n40", "unverified_n4"])
def test_same_seed_reproduces_the_earlier_intervals(name: str) -> None:
    """scipy draws the resampled prompts with the call the hand-written bootstrap made, so an
    interval computed before for a seed is the interval computed now for that seed."""
    base, cand = DATASETS[name]
    _, lo, hi, _, _ = reference_effect(base, cand, 2000, seed=SEED)
    e = paired_effect(base, cand, n_boot=2000, seed=SEED)
    assert e.ci_low == pytest.approx(lo, abs=1e-12) and e.ci_high == pytest.approx(hi, abs=1e-12)
    again = paired_effect(base, cand, n_boot=2000, seed=SEED)
    assert again == e  # deterministic for a seed


def test_drift_test_one_category_matches_the_oracle() -> None:
    base, cand = DATASETS["drop_n12"]
    rows_b = [{"id": i, "category": "code", "accepted": a, "rejections": r}
              for i, (a, r) in enumerate(base)]  # fmt: skip
    rows_c = [{"id": i, "category": "code", "accepted": a, "rejections": r}
              for i, (a, r) in enumerate(cand)]  # fmt: skip
    out = drift_test(rows_b, rows_c, margin=0.05, significance=0.05, n_boot=B)
    assert list(out) == ["code"]
    code = out["code"]
    _, _, _, p, _ = reference_effect(base, cand, B, seed=SEED + 1)
    assert code.p_value is not None and abs(code.p_value - p) <= _p_tolerance(p, code.p_value)
    assert code.p_holm == code.p_value  # one category: Holm changes nothing
    assert code.drifted


def _step_down_rejects(p_values: Mapping[str, float | None], level: float) -> set[str]:
    """Holm's procedure as stated: walk the sorted p-values, reject while p_(i) <= level/(m-i)."""
    items = sorted((p, k) for k, p in p_values.items() if p is not None)
    rejected: set[str] = set()
    for i, (p, k) in enumerate(items):
        if p > level / (len(items) - i):
            break
        rejected.add(k)
    return rejected


def test_holm_agrees_exactly() -> None:
    rng = np.random.default_rng(3)
    cases: list[dict[str, float | None]] = [
        {"a": 0.01, "b": 0.04, "c": 0.03, "d": None},
        {"only": 0.02},
        {"x": 0.02, "y": 0.02, "z": 0.02},  # ties
        {"x": 0.9, "y": 0.8, "z": 1.0},
        {"x": None, "y": None},
    ]
    for m in (2, 3, 5, 8):
        for _ in range(25):
            ps = rng.choice([rng.uniform(0, 0.1), rng.uniform(0, 1)], size=m)
            cases.append({f"c{i}": float(p) for i, p in enumerate(ps)})
    for case in cases:
        adj = holm(case)
        assert adj == reference_holm(case)
        # adjusted p <= level exactly when the step-down procedure rejects at that level
        # (levels just either side of each adjusted value, away from rounding at the edge)
        edges = [v * f for v in adj.values() if v is not None for f in (1 - 1e-9, 1 + 1e-9)]
        for level in [x for x in (*edges, 0.01, 0.05, 0.1) if x < 1]:  # capped at 1
            assert {k for k, v in adj.items() if v is not None and v <= level} == (
                _step_down_rejects(case, level)
            ), (case, level)
