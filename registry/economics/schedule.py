"""Speculate only where it pays: the draft length k that maximises predicted throughput at
each batch size, as the engines' batch-size schedules.

Acceptance length per k comes from one measurement's per-position acceptance. In a chain,
position i is accepted only if every position before it was, and whether it is does not
depend on how many positions come after, so a measurement taken at k_m gives the mean
acceptance length of every shorter chain exactly:

    AL(k) = 1 + Σ_{i<k} per_position[i]        (per_position[i] = accepted at i / steps)

Beyond k_m it is extrapolated with the last measured conditional acceptance held constant
(each further position accepted with that probability given the previous one was), and
marked so. AL(k) is τ (tokens per target call) for the economics model; k = 0 is plain
decoding.

Throughput at batch b with draft length k is the model's ``spec_tokens_per_s`` (plain:
``plain_tokens_per_s``); the best k is chosen at every batch size from 1 to the largest
that fits, and runs of equal k become ``[start_bs, end_bs, k]`` ranges (vLLM's
``speculative_config.num_speculative_tokens_per_batch_size``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

K_MAX = 8
# Batch sizes scheduled when the caller gives no limit (and memory allows more).
DEFAULT_MAX_BATCH = 512


@dataclass(frozen=True)
class AcceptanceLength:
    k: int
    length: float
    source: str  # "plain", "measured" or "extrapolated"


def acceptance_lengths(
    per_position: list[float | None],
    per_position_conditional: list[float | None],
    k_max: int = K_MAX,
) -> list[AcceptanceLength]:
    """AL(k) for k = 0..k_max from one measurement's per-position rates (see module doc)."""
    out = [AcceptanceLength(0, 1.0, "plain")]
    reach = [float(p) for p in per_position if p is not None]
    total = 1.0
    for k in range(1, min(k_max, len(reach)) + 1):
        total += reach[k - 1]
        out.append(AcceptanceLength(k, total, "measured"))
    if len(out) - 1 < k_max:
        cond = [float(c) for c in per_position_conditional if c is not None]
        last_cond = cond[-1] if cond else 0.0
        last_reach = reach[-1] if reach else 0.0
        for k in range(len(out), k_max + 1):
            last_reach *= last_cond
            total += last_reach
            out.append(AcceptanceLength(k, total, "extrapolated"))
    return out


@dataclass(frozen=True)
class Range:
    start_bs: int
    end_bs: int
    k: int
    # predicted tokens/s at the range's ends with the chosen k, plain, and the fixed k
    tokens_per_s: tuple[float, float]
    plain_tokens_per_s: tuple[float, float]
    fixed_k_tokens_per_s: tuple[float, float]


def choose(throughput: Callable[[int, int], float], ks: list[int], max_batch: int) -> list[Range]:
    """The k in ``ks`` (0 = no speculation) with the highest ``throughput(b, k)`` at every
    batch size 1..max_batch, merged into ranges. Ties go to the smaller k (less work for
    the same predicted output)."""
    if max_batch < 1:
        return []
    best: list[int] = []
    for b in range(1, max_batch + 1):
        scores = [(throughput(b, k), -k) for k in sorted(set(ks) | {0})]
        best.append(-max(scores)[1])
    ranges: list[tuple[int, int, int]] = []
    for b, k in enumerate(best, start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], b, k)
        else:
            ranges.append((b, b, k))
    return [
        Range(
            s,
            e,
            k,
            (throughput(s, k), throughput(e, k)),
            (throughput(s, 0), throughput(e, 0)),
            (0.0, 0.0),
        )  # fmt: skip
        for s, e, k in ranges
    ]


def vllm_schedule(ranges: list[Range]) -> list[list[int]]:
    """``[[start_bs, end_bs, k], …]``: inclusive ranges from batch 1 (vLLM uses the last
    range's k above the last end, and caps every k at ``num_speculative_tokens``)."""
    return [[r.start_bs, r.end_bs, r.k] for r in ranges]


def trtllm_draft_len_schedule(ranges: list[Range]) -> dict[int, int]:
    """TensorRT-LLM's ``draft_len_schedule`` (PyTorch backend): batch size >= key uses the
    value as the draft length; 0 turns speculation off."""
    return {r.start_bs: r.k for r in ranges}
