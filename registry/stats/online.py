"""An anytime-valid test for a drop in online acceptance, one served request at a time.

Why a betting e-process: online acceptance is looked at after every ingest batch, for as
long as a pair is live. A fixed-sample test repeated that way raises false alarms without
bound; a test whose evidence is a nonnegative supermartingale under the null does not
(Ville's inequality: ``P(sup_t K_t >= 1/a) <= a``), however often and whenever one looks.

The unit is the request: ``x_t = accepted_t / drafted_t`` in [0, 1], one value per request
with spec-decode counters. Tokens inside a request are correlated (the same prompt, the
same context), requests much less so. Null hypothesis for a *drop*: the mean per-request
rate is at least ``m`` (the validated rate minus a tolerance). The gambler bets on
``y_t = (m - x_t) / s`` with ``s = max(m, 1 - m)`` so that ``y_t`` lies in [-1, 1]:

    K_t = prod_{i <= t} (1 + lambda_i * y_i),  lambda_i in [0, 1/2] chosen before x_i

Under the null ``E[y_t | past] <= 0``, so ``E[1 + lambda_t y_t | past] <= 1`` and ``K`` is a
nonnegative supermartingale; an alarm when ``K_t >= 1/a`` has level ``a`` uniformly over
time, with no assumption on the distribution of ``x`` beyond boundedness. The bet size is
chosen by online Newton step (ONS), which grows wealth at near the optimal rate when the
mean is below ``m``:

* Waudby-Smith & Ramdas, "Estimating means of bounded random variables by betting",
  JRSS-B 86(1), 2024 (the betting martingale for bounded means);
* Cutkosky & Orabona, "Black-box reductions for parameter-free online learning in Banach
  spaces", COLT 2018, and Shekhar & Ramdas, "Nonparametric two-sample testing by
  betting", IEEE Trans. Inf. Theory 70(2), 2024, Algorithm 1 (the ONS bet used here).

Recovery is the mirror test, started when the drop alarm fires: null "the mean is still at
most ``m``", i.e. the same e-process on ``1 - x`` against ``1 - m``.

Wealth is kept as its logarithm so long streams neither overflow nor underflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_BET = 0.5
_ONS_RATE = 2.0 / (2.0 - math.log(3.0))


@dataclass
class BettingState:
    """The whole state of one e-process: enough to resume it after a restart."""

    log_wealth: float = 0.0
    bet: float = 0.0
    ons_sum: float = 1.0
    n: int = 0
    x_sum: float = 0.0  # the observations' sum, for the evidence a flag carries

    def as_dict(self) -> dict[str, float | int]:
        return {"log_wealth": self.log_wealth, "bet": self.bet, "ons_sum": self.ons_sum,
                "n": self.n, "x_sum": self.x_sum}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, float | int] | None) -> BettingState:
        if not d:
            return cls()
        return cls(float(d["log_wealth"]), float(d["bet"]), float(d["ons_sum"]), int(d["n"]),
                   float(d.get("x_sum", 0.0)))  # fmt: skip


def threshold(level: float) -> float:
    """log(1/a): the alarm line for the log wealth."""
    if not 0.0 < level < 1.0:
        raise ValueError("level must be in (0, 1)")
    return math.log(1.0 / level)


def _scale(m: float) -> float:
    return max(m, 1.0 - m, 1e-12)


def update(state: BettingState, x: float, m: float) -> BettingState:
    """Feed one observation ``x`` in [0, 1] to the e-process for ``H0: mean >= m``.

    The bet used on ``x`` was fixed before ``x`` was seen (predictable), as validity needs.
    """
    new = BettingState(state.log_wealth, state.bet, state.ons_sum, state.n, state.x_sum)
    step(new, x, m)
    return new


def step(state: BettingState, x: float, m: float) -> float:
    """:func:`update` in place (ingest feeds thousands a batch: no new object each), the
    same arithmetic in the same order; returns the new log wealth."""
    x = min(max(float(x), 0.0), 1.0)
    y = (m - x) / _scale(m)
    growth = 1.0 + state.bet * y
    z = y / growth
    ons_sum = state.ons_sum + z * z
    state.bet = min(max(state.bet + _ONS_RATE * z / ons_sum, 0.0), MAX_BET)
    state.ons_sum = ons_sum
    state.log_wealth += math.log(growth)
    state.n += 1
    state.x_sum += x
    return state.log_wealth


def simulate(xs: np.ndarray, m: float, level: float) -> np.ndarray:
    """Run the same e-process on many streams at once (rows of ``xs``), for simulations.

    Returns, per stream, the index (1-based request count) at which ``K_t >= 1/level``
    first held, or 0 when it never did. The arithmetic is :func:`update`'s, vectorised
    over streams.
    """
    xs = np.clip(np.asarray(xs, dtype=float), 0.0, 1.0)
    n_streams, horizon = xs.shape
    log_w = np.zeros(n_streams)
    bet = np.zeros(n_streams)
    ons = np.ones(n_streams)
    alarm = np.zeros(n_streams, dtype=np.int64)
    line = threshold(level)
    s = _scale(m)
    for t in range(horizon):
        y = (m - xs[:, t]) / s
        growth = 1.0 + bet * y
        log_w += np.log(growth)
        z = y / growth
        ons += z * z
        bet = np.clip(bet + _ONS_RATE * z / ons, 0.0, MAX_BET)
        hit = (alarm == 0) & (log_w >= line)
        alarm[hit] = t + 1
    return alarm
