"""Paired drift statistics: is a candidate's acceptance lower than its baseline's?

The unit is the prompt, never the token (tokens within a prompt are correlated). Both
measurements ran the same prompts, so each category compares the two on the same prompts:

* effect: ``α_candidate − α_baseline`` where each α is the ratio of sums
  ``accepted / (accepted + rejections)`` over the category's prompts (the α the registry
  reports), plus the mean of per-prompt differences for reference;
* interval: a paired percentile bootstrap over prompts (the same resampled prompts for both
  sides), ``scipy.stats.bootstrap(paired=True, method="percentile")``;
* p-value: a paired permutation test (swap the two measurements of a prompt at random), one
  sided for a drop, ``scipy.stats.permutation_test(permutation_type="samples",
  alternative="less")``. Under "nothing changed" the two measurements of a prompt are
  exchangeable, so the test holds its level whatever the per-prompt distribution. When the
  resample count covers all 2^n arrangements scipy enumerates them (an exact p-value);
* Holm's step-down correction across categories keeps the family-wise error at the
  policy's significance level.

A category drifts when its drop exceeds the policy margin *and* its Holm-adjusted p-value is
below the significance level: big enough to matter and unlikely to be noise.

scipy is imported inside the functions that use it: the CLI and API import this module at
start-up, and ``scipy.stats`` costs about half a second there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from registry.stats.intervals import paired_percentile_interval

SEED = 20240611


@dataclass
class CategoryEffect:
    category: str
    prompts: int
    baseline_alpha: float | None
    candidate_alpha: float | None
    diff: float | None
    mean_prompt_diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_holm: float | None = None
    significant: bool = False
    exceeds_margin: bool = False
    drifted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _alpha(acc: np.ndarray, rej: np.ndarray) -> np.ndarray:
    """Ratio of sums along the last axis; NaN where nothing was verified."""
    num = acc.sum(axis=-1)
    den = num + rej.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def paired_effect(
    base: Sequence[tuple[float, float]],
    cand: Sequence[tuple[float, float]],
    *,
    n_boot: int = 2000,
    seed: int = SEED,
    category: str = "",
) -> CategoryEffect:
    """Effect, bootstrap CI (95%) and one-sided permutation p-value for one category.

    ``base[i]`` and ``cand[i]`` are ``(accepted, rejections)`` of the same prompt.
    """
    if len(base) != len(cand):
        raise ValueError("paired samples must have the same length")
    n = len(base)
    b = np.asarray(base, dtype=float).reshape(n, 2)
    c = np.asarray(cand, dtype=float).reshape(n, 2)
    a_b, a_c = float(_alpha(b[:, 0], b[:, 1])), float(_alpha(c[:, 0], c[:, 1]))
    if n == 0 or np.isnan(a_b) or np.isnan(a_c):
        return CategoryEffect(
            category, n, _nan_none(a_b), _nan_none(a_c), None, None, None, None, None
        )
    diff = a_c - a_b
    with np.errstate(invalid="ignore", divide="ignore"):
        pb = b[:, 0] / (b[:, 0] + b[:, 1])
        pc = c[:, 0] / (c[:, 0] + c[:, 1])
    ok = ~(np.isnan(pb) | np.isnan(pc))
    mean_prompt = float(np.mean(pc[ok] - pb[ok])) if ok.any() else None

    if n == 1:
        # scipy needs two prompts. With one, every resample is that prompt, and the only
        # other arrangement is the swap, which negates the effect: exactly p = 1/2 for a drop.
        p1 = 1.0 if diff >= 0 else 0.5
        return CategoryEffect(category, n, a_b, a_c, diff, mean_prompt, diff, diff, p1)
    # one generator, bootstrap first: scipy draws the resampled prompts with the same call
    # the earlier hand-written bootstrap made, so intervals stored before stay reproducible
    rng = np.random.default_rng(seed)
    lo, hi = _bootstrap_interval(b, c, n_boot, rng)
    p = _permutation_p(b, c, n_boot, rng)
    return CategoryEffect(category, n, a_b, a_c, diff, mean_prompt, lo, hi, p)


def _effect(
    b_acc: np.ndarray, b_rej: np.ndarray, c_acc: np.ndarray, c_rej: np.ndarray, axis: int = -1
) -> np.ndarray:
    """α(candidate) − α(baseline) over the last axis (scipy hands resamples that way)."""
    return _alpha(c_acc, c_rej) - _alpha(b_acc, b_rej)


def _bootstrap_interval(
    b: np.ndarray, c: np.ndarray, n_boot: int, rng: np.random.Generator
) -> tuple[float | None, float | None]:
    """95% paired percentile bootstrap of the effect, resampling prompts.

    A resample holding only prompts where nothing was verified has no α; such resamples are
    left out of the percentiles rather than voiding the interval (scipy's quantile would
    return NaN for all of it).
    """
    return paired_percentile_interval((b[:, 0], b[:, 1], c[:, 0], c[:, 1]), _effect, n_boot, rng)


def _permutation_p(b: np.ndarray, c: np.ndarray, n_perm: int, rng: np.random.Generator) -> float:
    """One-sided (a drop) paired permutation p-value of the effect.

    ``permutation_type="samples"`` exchanges the two observations of each pair, which is
    swapping a prompt's baseline and candidate measurements. Each measurement is two numbers
    (accepted, rejections) that must move together, so the samples handed to scipy are row
    indices into the stacked counters: baseline rows ``0..n-1``, candidate rows ``n..2n-1``.
    Randomised, the observed arrangement counts once (``(1 + hits) / (1 + n_perm)``, never
    zero); exact when ``n_perm >= 2**n``.
    """
    from scipy import stats

    n = len(b)
    rows = np.concatenate([b, c])

    def statistic(ib: np.ndarray, ic: np.ndarray, axis: int = -1) -> np.ndarray:
        return _alpha(rows[ic, 0], rows[ic, 1]) - _alpha(rows[ib, 0], rows[ib, 1])

    res = stats.permutation_test(
        (np.arange(n), np.arange(n, 2 * n)),
        statistic,
        permutation_type="samples",
        vectorized=True,
        n_resamples=n_perm,
        alternative="less",
        rng=rng,
    )
    return min(float(res.pvalue), 1.0)


def _nan_none(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm step-down adjusted p-values (monotone, capped at 1)."""
    items = sorted(((p, k) for k, p in p_values.items() if p is not None))
    m = len(items)
    out: dict[str, float | None] = {k: None for k, p in p_values.items() if p is None}
    running = 0.0
    for i, (p, k) in enumerate(items):
        running = max(running, min(1.0, (m - i) * p))
        out[k] = running
    return out


def pair_prompts(
    baseline: Iterable[Mapping[str, Any]], candidate: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[list[tuple[float, float]], list[tuple[float, float]]]]:
    """Per category, the (accepted, rejections) of prompts present in both measurements."""
    cand = {str(p["id"]): p for p in candidate}
    out: dict[str, tuple[list[tuple[float, float]], list[tuple[float, float]]]] = {}
    for p in baseline:
        q = cand.get(str(p["id"]))
        if q is None or q.get("category") != p.get("category"):
            continue
        b_list, c_list = out.setdefault(str(p["category"]), ([], []))
        b_list.append((float(p.get("accepted", 0)), float(p.get("rejections", 0))))
        c_list.append((float(q.get("accepted", 0)), float(q.get("rejections", 0))))
    return out


def drift_test(
    baseline_prompts: Iterable[Mapping[str, Any]],
    candidate_prompts: Iterable[Mapping[str, Any]],
    *,
    margin: float,
    significance: float,
    n_boot: int = 2000,
    seed: int = SEED,
) -> dict[str, CategoryEffect]:
    """Every category's effect, Holm-corrected, with the drifted verdict filled in."""
    pairs = pair_prompts(baseline_prompts, candidate_prompts)
    effects = {
        cat: paired_effect(b, c, n_boot=n_boot, seed=seed, category=cat)
        for cat, (b, c) in sorted(pairs.items())
    }
    adjusted = holm({cat: e.p_value for cat, e in effects.items()})
    for cat, e in effects.items():
        e.p_holm = adjusted[cat]
        e.significant = e.p_holm is not None and e.p_holm < significance
        e.exceeds_margin = e.diff is not None and -e.diff > margin
        e.drifted = e.significant and e.exceeds_margin
    return effects


def severity(effects: Mapping[str, CategoryEffect], margin: float) -> str:
    """high: some drifted category fell by more than twice the margin; medium otherwise."""
    drops = [-e.diff for e in effects.values() if e.drifted and e.diff is not None]
    if not drops:
        return "low"
    return "high" if max(drops) > 2 * margin else "medium"
