"""scipy's bootstrap gives the intervals the hand-written runner code gave.

The earlier percentile bootstrap (numpy, written out by hand) is kept below as the oracle.
Both run on synthetic per-prompt counters (several sizes, n = 1 and 2, ties, prompts that
never reached what a ratio counts) and must agree within Monte-Carlo error, compared on the
probability scale where the error of an empirical quantile does not depend on the shape of
the distribution: with ``B`` resamples on each side, the new lower end must lie between the
oracle's bootstrap quantiles at ``0.025 ± t`` and the upper end at ``0.975 ± t``, with
``t = 5 * sqrt(2 * 0.025 * 0.975 / B)`` (two independent estimates, five standard
deviations: a spurious failure across every comparison here has probability below 1e-4).
``B = 20_000`` gives ``t = 0.0078``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from runner.stats import BOOT_SEED, summarize

B = 20_000
T_Q = 5.0 * math.sqrt(2 * 0.025 * 0.975 / B)

# each interval and the (numerator, denominator) per prompt it is the ratio of sums of
RATIOS = {
    "alpha_ci": lambda a: (a["accepted"], a["accepted"] + a["rejections"]),
    "draft_acceptance_rate_ci": lambda a: (a["accepted"], a["drafted"]),
    "tau_ci": lambda a: (a["emitted"] - a["prefill_calls"], a["target_calls"] - a["prefill_calls"]),
    "expected_alpha_ci": lambda a: (a["beta_sum"], a["beta_count"]),
}


# ---- the oracle: the hand-written bootstrap this module had before scipy ------------------


def reference_ci(
    num: np.ndarray, den: np.ndarray, rng: np.random.Generator, n_boot: int
) -> tuple[list, np.ndarray]:
    """The interval as computed before, and its bootstrap distribution."""
    n = len(num)
    if n == 0 or den.sum() == 0:
        return [None, None], np.array([])
    idx = rng.integers(0, n, size=(n_boot, n))
    nums = num[idx].sum(axis=1)
    dens = den[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        vals = np.where(dens > 0, nums / np.where(dens > 0, dens, 1), np.nan)
    vals = vals[~np.isnan(vals)]
    if len(vals) == 0:
        return [None, None], vals
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return [float(lo), float(hi)], vals


# ---- synthetic rows ----------------------------------------------------------------------


def _rows(n: int, seed: int, *, greedy_every: int = 0, ties: bool = False) -> list[dict]:
    """Per-prompt counters; every ``greedy_every``-th prompt has no sum-min positions."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        steps = 4 if ties else int(rng.integers(3, 12))
        drafted = 4 * steps
        acc = int(rng.choice([10, 12])) if ties else int(rng.binomial(drafted, 0.6))
        rej = min(steps, drafted - acc)
        beta_count = 0 if greedy_every and i % greedy_every == 0 else acc + rej
        rows.append(
            {
                "category": ("code", "prose")[i % 2],
                "target_calls": steps + 1,
                "prefill_calls": 1,
                "steps": steps,
                "drafted": drafted,
                "accepted": acc,
                "rejections": rej,
                "emitted": 1 + acc + steps,
                "beta_sum": 0.7 * beta_count,
                "beta_count": beta_count,
                "draft_time_s": 0.01,
                "target_time_s": 0.02,
                "accepted_per_position": [acc, 0, 0, 0],
                "verified_per_position": [acc + rej, 0, 0, 0],
            }
        )
    return rows


DATASETS = {
    "n60": _rows(60, 1),
    "n9": _rows(9, 2),
    "n4": _rows(4, 3),
    "n2": _rows(2, 4),  # one prompt per category
    "ties_n20": _rows(20, 5, ties=True),
    "greedy_mix_n5": _rows(5, 6, greedy_every=2),  # some resamples have no sum-min positions
}


def _arrays(rows: list[dict]) -> dict[str, np.ndarray]:
    counters = [f for f, v in rows[0].items() if isinstance(v, int | float)]
    return {f: np.array([float(r[f]) for r in rows]) for f in counters}


def _groups(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"overall": rows}
    for r in rows:
        out.setdefault(r["category"], []).append(r)
    return out


def _pick(summary: dict[str, Any], group: str) -> dict[str, Any]:
    return summary["overall"] if group == "overall" else summary["categories"][group]


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_scipy_matches_hand_written_within_monte_carlo_error(name: str) -> None:
    rows = DATASETS[name]
    new = summarize(rows, k=4, n_boot=B, seed=BOOT_SEED)
    checked = 0
    for group, grows in _groups(rows).items():
        arr = _arrays(grows)
        rng = np.random.default_rng(BOOT_SEED + 1)  # independent random numbers
        for key, ratio in RATIOS.items():
            (lo, hi), dist = reference_ci(*ratio(arr), rng, B)
            got = _pick(new, group)[key]
            if lo is None:
                assert got == [None, None]
                continue
            for value, level in ((got[0], 0.025), (got[1], 0.975)):
                band = (
                    float(np.quantile(dist, max(level - T_Q, 0))) - 1e-12,
                    float(np.quantile(dist, min(level + T_Q, 1))) + 1e-12,
                )
                assert band[0] <= value <= band[1], (group, key, value, band)
            checked += 1
    assert checked >= 3 * len(RATIOS) - 3  # every group and interval that exists was compared


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_same_seed_reproduces_the_earlier_intervals(name: str) -> None:
    """scipy draws the resampled prompts with the call the hand-written bootstrap made and the
    summary hands it one generator in the same order, so stored intervals stay reproducible."""
    rows = DATASETS[name]
    new = summarize(rows, k=4)
    again = summarize(rows, k=4)
    assert new == again  # deterministic for a seed
    for group, grows in _groups(rows).items():
        arr = _arrays(grows)
        rng = np.random.default_rng(BOOT_SEED)
        for key, ratio in RATIOS.items():
            want, _ = reference_ci(*ratio(arr), rng, 2000)
            got = _pick(new, group)[key]
            assert got == pytest.approx(want, abs=1e-12), (group, key)


def test_single_prompt_interval_is_its_own_ratio() -> None:
    out = summarize(DATASETS["n2"][:1], k=4)["overall"]
    assert out["alpha_ci"] == [out["alpha"], out["alpha"]]
    assert out["tau_ci"] == [out["tau"], out["tau"]]
