"""Step timings for pair economics: what one target pass costs as a function of the tokens
it verifies, and what one drafting step costs, on the machine that measures.

The engine feeds every timed pass in here; :func:`economics_summary` turns a speculative
run and a plain run over the same prompts into the measured speed-up and the model's
prediction from the same timings (:func:`registry.economics.model.measured_prediction`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from registry.economics.model import measured_prediction


@dataclass
class StepTimings:
    """Sums of (calls, seconds) per number of tokens in a decoding target pass, the
    prefill passes apart, and drafting steps by the number of tokens asked for."""

    target: dict[int, list[float]] = field(default_factory=dict)
    prefill: list[float] = field(default_factory=lambda: [0, 0.0, 0])  # calls, seconds, tokens
    draft: dict[int, list[float]] = field(default_factory=dict)
    decode_wall: list[float] = field(default_factory=lambda: [0.0, 0])  # seconds, tokens

    def add_target(self, tokens: int, seconds: float, *, prefill: bool = False) -> None:
        if prefill:
            self.prefill[0] += 1
            self.prefill[1] += seconds
            self.prefill[2] += tokens
            return
        row = self.target.setdefault(tokens, [0, 0.0])
        row[0] += 1
        row[1] += seconds

    def add_draft(self, tokens: int, seconds: float) -> None:
        row = self.draft.setdefault(tokens, [0, 0.0])
        row[0] += 1
        row[1] += seconds

    def add_decode(self, seconds: float, tokens: int) -> None:
        """Wall time of one prompt's decoding loop (after the prefill pass) and the tokens
        it emitted: what the speed-up compares, drafting and verification included."""
        self.decode_wall[0] += seconds
        self.decode_wall[1] += tokens

    def reset(self) -> None:
        self.target.clear()
        self.draft.clear()
        self.prefill = [0, 0.0, 0]
        self.decode_wall = [0.0, 0]

    @property
    def decode_calls(self) -> int:
        return int(sum(r[0] for r in self.target.values()))

    @property
    def decode_seconds(self) -> float:
        return float(sum(r[1] for r in self.target.values()))

    @property
    def draft_seconds(self) -> float:
        return float(sum(r[1] for r in self.draft.values()))

    def to_dict(self) -> dict[str, Any]:
        def table(d: dict[int, list[float]]) -> dict[str, dict[str, float]]:
            return {
                str(n): {"calls": int(c), "seconds": s, "mean_s": s / c if c else None}
                for n, (c, s) in sorted(d.items())
            }

        return {
            "target_by_tokens": table(self.target),
            "prefill": {
                "calls": int(self.prefill[0]),
                "seconds": self.prefill[1],
                "tokens": int(self.prefill[2]),
            },
            "draft_by_tokens": table(self.draft),
            "decode": {"seconds": self.decode_wall[0], "tokens": int(self.decode_wall[1])},
        }


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def economics_summary(
    spec: StepTimings,
    plain: StepTimings | None,
    *,
    tau: float | None,
) -> dict[str, Any]:
    """Measured costs and speed-up (decoding only: prefill passes are left out of both
    sides) and the batch-1 prediction from the same timings."""
    spec_decode_s, spec_decode_tokens = spec.decode_wall[0], int(spec.decode_wall[1])
    plain_decode_s = plain.decode_wall[0] if plain is not None else None
    plain_decode_tokens = int(plain.decode_wall[1]) if plain is not None else None
    verify_call = _div(spec.decode_seconds, spec.decode_calls)
    # drafting time per decoding step (steps that drafted nothing count as zero)
    draft_step = _div(spec.draft_seconds, spec.decode_calls) or 0.0
    out: dict[str, Any] = {
        "spec": spec.to_dict(),
        "spec_decode_s": spec_decode_s,
        "spec_decode_tokens": spec_decode_tokens,
        "verify_call_s": verify_call,
        "draft_step_s": draft_step,
        "tokens_per_verify_pass": _div(
            sum(n * r[0] for n, r in spec.target.items()), spec.decode_calls
        ),
    }
    if plain is None or not plain_decode_tokens or not spec_decode_tokens:
        return out
    plain_call = _div(plain.decode_seconds, plain.decode_calls)
    spec_per_tok = spec_decode_s / spec_decode_tokens
    plain_per_tok = (plain_decode_s or 0.0) / plain_decode_tokens
    out.update(
        {
            "plain": plain.to_dict(),
            "plain_decode_s": plain_decode_s,
            "plain_decode_tokens": plain_decode_tokens,
            "plain_call_s": plain_call,
            # c as in Leviathan et al.: one drafted token (a tree: one level) / one target pass
            "cost_ratio_c": _div(
                _div(spec.draft_seconds, sum(k * r[0] for k, r in spec.draft.items())) or 0.0,
                plain_call or 0.0,
            ),
            "speedup_measured": _div(plain_per_tok, spec_per_tok),
        }
    )
    if tau and plain_call and verify_call:
        pred = measured_prediction(tau, plain_call, verify_call, draft_step)
        out["speedup_predicted"] = None if math.isnan(pred) else pred
    return out
