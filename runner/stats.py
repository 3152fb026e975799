"""Acceptance statistics derived from raw per-prompt counters.

Definitions (see the field reference): ``alpha = accepted / (accepted + rejections)``
(truncated-geometric MLE of per-token acceptance); for a token tree a step's "rejection" is
a walk that stopped at a node with candidates (none matched), so alpha is the probability
of advancing one level given the level had candidates — the chain's alpha when every level
has one candidate, comparable across chains and trees; ``draft_acceptance_rate =
accepted / drafted`` (vLLM); ``tau`` = tokens emitted per decoding target call (bonus
included, prefill call excluded, 1.0 for plain decoding); ``expected_alpha`` = mean of
beta = sum min(p, q) over verified positions (sampling only). Tokens within a prompt are
correlated, so intervals come from
a percentile bootstrap over prompts (ratio of sums per resample, ``scipy.stats.bootstrap``
with ``paired=True``), never from a binomial over tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from registry.stats.intervals import paired_percentile_interval

COUNTER_FIELDS = (
    "target_calls",
    "prefill_calls",
    "steps",
    "drafted",
    "accepted",
    "rejections",
    "emitted",
    "beta_sum",
    "beta_count",
    "draft_time_s",
    "target_time_s",
)
N_BOOT = 2000
BOOT_SEED = 20240601


def _get(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def theoretical_tau(alpha: float | None, k: int) -> float | None:
    """Expected tokens per target call for i.i.d. acceptance: (1 - a^(k+1)) / (1 - a)."""
    if alpha is None or math.isnan(alpha):
        return None
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup_estimate(alpha: float | None, k: int, c: float | None) -> float | None:
    """Walltime improvement (1 - a^(k+1)) / ((1 - a)(k c + 1)), c = draft/target step cost."""
    tau = theoretical_tau(alpha, k)
    if tau is None or c is None or math.isnan(c):
        return None
    return tau / (k * c + 1)


def _ratio(num: float, den: float) -> float | None:
    return None if den == 0 else num / den


def _ratio_of_sums(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    """sum(num) / sum(den) along ``axis``; NaN where the denominator is zero."""
    nums, dens = num.sum(axis=axis), den.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(dens > 0, nums / np.where(dens > 0, dens, 1), np.nan)


def _ci(num: np.ndarray, den: np.ndarray, rng: np.random.Generator, n_boot: int) -> list:
    """95% percentile bootstrap of sum(num)/sum(den), resampling prompts with replacement.

    Each call draws from the shared ``rng``, so the intervals of one summary are
    reproducible for its seed. A resample whose denominator is zero (only prompts that never
    reached what is counted) has no ratio; such resamples are left out of the percentiles
    rather than voiding the interval (scipy's quantile would return NaN for all of it).
    """
    n = len(num)
    if n == 0 or den.sum() == 0:
        return [None, None]
    if n == 1:  # scipy needs two observations; every resample of one prompt is that prompt
        v = float(num[0] / den[0])
        return [v, v]
    return list(paired_percentile_interval((num, den), _ratio_of_sums, n_boot, rng))


def vllm_counters(sums: Mapping[str, float], accepted_per_position: Any) -> dict[str, Any]:
    """The counters a vLLM deployment exports (``vllm:spec_decode_num_drafts`` …) from
    ours, so a measurement compares with a deployment's own Prometheus figures. For a
    tree, a draft token is a tree node the target verified and position ``i`` is depth
    ``i + 1`` of the accepted path."""
    return {
        "num_drafts": int(sums["steps"]),
        "num_draft_tokens": int(sums["drafted"]),
        "num_accepted_tokens": int(sums["accepted"]),
        "num_accepted_tokens_per_pos": [int(x) for x in accepted_per_position],
    }


def summarize_group(
    rows: Sequence[Any], k: int, n_boot: int = N_BOOT, seed: int = BOOT_SEED
) -> dict[str, Any]:
    """Statistics for one set of prompts (a category or all of them)."""
    sums: dict[str, float] = {f: 0.0 for f in COUNTER_FIELDS}
    arr: dict[str, np.ndarray] = {}
    for f in COUNTER_FIELDS:
        arr[f] = np.array([float(_get(r, f)) for r in rows], dtype=np.float64)
        sums[f] = float(arr[f].sum())
    acc_pos = np.zeros(k)
    ver_pos = np.zeros(k)
    for r in rows:
        a = list(_get(r, "accepted_per_position"))[:k]
        v = list(_get(r, "verified_per_position"))[:k]
        acc_pos[: len(a)] += a
        ver_pos[: len(v)] += v
    rng = np.random.default_rng(seed)
    alpha = _ratio(sums["accepted"], sums["accepted"] + sums["rejections"])
    dar = _ratio(sums["accepted"], sums["drafted"])
    # the prefill call emits exactly one token per prompt whatever the drafter; leaving it
    # out makes tau the per-decoding-step figure that (1 - a^(k+1)) / (1 - a) predicts
    dec_emitted = arr["emitted"] - arr["prefill_calls"]
    dec_calls = arr["target_calls"] - arr["prefill_calls"]
    tau = _ratio(float(dec_emitted.sum()), float(dec_calls.sum()))
    exp_alpha = _ratio(sums["beta_sum"], sums["beta_count"])
    steps = sums["steps"]
    # c: cost of drafting one token relative to one target call
    draft_per_token = _ratio(sums["draft_time_s"], sums["drafted"])
    target_per_call = _ratio(sums["target_time_s"], sums["target_calls"])
    c = (
        None
        if draft_per_token is None or not target_per_call
        else draft_per_token / target_per_call
    )
    counters = {
        f: (int(v) if not f.endswith("_s") and f != "beta_sum" else v) for f, v in sums.items()
    }
    counters["accepted_per_position"] = [int(x) for x in acc_pos]
    counters["verified_per_position"] = [int(x) for x in ver_pos]
    return {
        "prompts": len(rows),
        "alpha": alpha,
        "alpha_ci": _ci(arr["accepted"], arr["accepted"] + arr["rejections"], rng, n_boot),
        "draft_acceptance_rate": dar,
        "draft_acceptance_rate_ci": _ci(arr["accepted"], arr["drafted"], rng, n_boot),
        "tau": tau,
        "tau_ci": _ci(dec_emitted, dec_calls, rng, n_boot),
        "tau_theoretical": theoretical_tau(alpha, k),
        "mean_acceptance_length": None if not steps else 1 + sums["accepted"] / steps,
        "expected_alpha": exp_alpha,
        "expected_alpha_ci": _ci(arr["beta_sum"], arr["beta_count"], rng, n_boot),
        # vLLM style: accepted at position i / number of drafting steps
        "per_position": [float(a / steps) if steps else None for a in acc_pos],
        # conditional: accepted at i / times position i was actually verified
        "per_position_conditional": [
            float(a / v) if v else None for a, v in zip(acc_pos, ver_pos, strict=True)
        ],
        # trees: candidates the target checked per step, and tokens it kept per step
        "draft_tokens_per_step": _ratio(sums["drafted"], steps),
        "accepted_per_step": _ratio(sums["accepted"], steps),
        "vllm": vllm_counters(sums, acc_pos),
        "cost_ratio_c": c,
        "speedup_estimate": speedup_estimate(alpha, k, c),
        "counters": counters,
    }


def summarize(
    prompt_results: Iterable[Any], k: int, n_boot: int = N_BOOT, seed: int = BOOT_SEED
) -> dict[str, Any]:
    """Per-category and overall statistics from per-prompt rows (dicts or objects with
    ``category`` plus the raw counters), so a registry can recompute from stored rows."""
    rows = list(prompt_results)
    by_cat: dict[str, list[Any]] = {}
    for r in rows:
        by_cat.setdefault(str(_get(r, "category")), []).append(r)
    return {
        "categories": {c: summarize_group(rs, k, n_boot, seed) for c, rs in sorted(by_cat.items())},
        "overall": summarize_group(rows, k, n_boot, seed),
    }
