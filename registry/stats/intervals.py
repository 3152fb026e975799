"""The 95% paired percentile bootstrap shared by acceptance intervals (``runner.stats``) and
drift effects (``registry.stats.drift``).

Both resample prompts with ``scipy.stats.bootstrap`` and both meet resamples whose statistic
is undefined (only prompts where nothing was verified): those are left out of the
percentiles rather than voiding the interval, as scipy's quantile would (NaN for all of it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np


def paired_percentile_interval(
    samples: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    n_boot: int,
    rng: np.random.Generator,
) -> tuple[float | None, float | None]:
    """95% percentile interval of a vectorised ``statistic`` over paired ``samples``;
    ``(None, None)`` when no resample has a defined statistic."""
    from scipy import stats  # scipy loads only when an interval is asked for

    with warnings.catch_warnings(action="ignore", category=stats.DegenerateDataWarning):
        res = stats.bootstrap(
            tuple(samples),
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=n_boot,
            method="percentile",
            confidence_level=0.95,
            rng=rng,
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if np.isnan(lo) or np.isnan(hi):
        dist = res.bootstrap_distribution[~np.isnan(res.bootstrap_distribution)]
        if not dist.size:
            return None, None
        lo, hi = (float(q) for q in np.quantile(dist, [0.025, 0.975]))
    return lo, hi
