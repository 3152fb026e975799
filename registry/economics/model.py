"""The speed-up and cost model: roofline step times, memory limits, break-even, cost.

One decoding step of a batch of ``b`` sequences, each verifying ``v`` tokens (1 for plain
decoding; 1 + drafted tokens per step with speculation), on a profile with bandwidth ``B``
and dense FLOPS ``F``:

    T(b, v) = overhead + max((W + b·L·kv) / B,  b·v·(2·P + attn(L)) / F)

W: weight bytes, P: parameters, kv: KV-cache bytes per token, L: context length,
attn(L) = 4 · layers · heads · head_dim · L. At small ``b`` the first term (stream the
weights once) wins, so verifying ``v`` tokens costs about what verifying one does; as
``b·v`` grows the second term takes over and extra verified tokens cost in proportion.

Speed-up at batch ``b``:  τ · T_target(b, 1) / (T_target(b, v) + passes · T_draft(b, w))

with τ the measured tokens emitted per target call, ``passes`` the drafter's forward
passes per step (γ for a draft model or an EAGLE head, 1 for Medusa heads, 0 for prompt
lookup) and ``w`` the tokens per sequence in each of them. τ is taken as independent of
``b`` (true for lossless rules; it ignores schedulers that shorten γ under load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from registry.economics.facts import ArchFacts, attention_flops_per_token
from registry.economics.hardware import HardwareProfile
from registry.methods import get_method

# vLLM's default gpu_memory_utilization: the share of memory a server plans with.
DEFAULT_MEMORY_FRACTION = 0.9
MAX_BATCH_SEARCH = 1 << 20


@dataclass(frozen=True)
class Part:
    """One model in the step: the target or the drafter."""

    weight_bytes: float
    params: float
    kv_bytes_per_token: float
    arch: ArchFacts

    @property
    def layers(self) -> int:
        return self.arch.num_layers or 0


def step_time(
    part: Part, hw: HardwareProfile, dtype: str, *, batch: int, tokens: float, context: int
) -> float:
    """Roofline time of one forward pass: ``batch`` sequences × ``tokens`` new tokens each,
    over ``context`` cached tokens, plus the profile's fixed per-pass overhead."""
    if batch <= 0 or tokens < 0:
        raise ValueError("batch must be positive and tokens non-negative")
    overhead = hw.step_overhead_s + hw.layer_overhead_s * part.layers
    memory = (part.weight_bytes + batch * context * part.kv_bytes_per_token) / hw.memory_bandwidth
    flops = batch * tokens * (2 * part.params + attention_flops_per_token(part.arch, context))
    return overhead + max(memory, flops / hw.flops_for(dtype))


def drafter_passes(method: str, k: int) -> int:
    """Forward passes of the drafter per decoding step (the method's ``draft_passes``:
    one per token for a draft model or EAGLE, one for Medusa's parallel heads, none for
    prompt lookup's host-side n-gram search)."""
    return get_method(method).drafter_passes(k)


@dataclass(frozen=True)
class Shape:
    """What one speculative step does: tokens verified per sequence, drafter passes."""

    method: str
    k: int
    tau: float
    verify_tokens: float  # 1 + drafted tokens per step (a tree counts its nodes)
    draft_passes: int
    draft_tokens_per_pass: float


def shape_for(method: str, k: int, tau: float, drafted_per_step: float | None = None) -> Shape:
    """A chain drafts ``k`` tokens per step; a tree ``drafted_per_step`` nodes (measured)
    over ``k`` levels, so each drafter pass handles nodes / k tokens per sequence."""
    drafted = float(k if drafted_per_step is None else drafted_per_step)
    m = get_method(method)
    passes = m.drafter_passes(k)
    per_pass = m.draft_tokens_per_pass(drafted, k)
    return Shape(method, k, float(tau), 1.0 + drafted, passes, max(per_pass, 1.0 if passes else 0))


@dataclass(frozen=True)
class Point:
    """The model's answer at one batch size."""

    batch: int
    fits: bool
    plain_step_s: float
    spec_step_s: float
    verify_s: float
    draft_s: float
    speedup: float
    plain_tokens_per_s: float | None  # None for a zero-cost step (no weights, no overhead)
    spec_tokens_per_s: float | None
    bound: str  # "memory" or "compute": what limits the target's verification pass
    cost_per_million_plain: float | None
    cost_per_million_emitted: float | None
    cost_per_million_accepted_draft: float | None


def _cost(price: float | None, seconds: float, tokens: float) -> float | None:
    if price is None or tokens <= 0:
        return None
    return price / 3600.0 * seconds / tokens * 1e6


def point(
    target: Part,
    drafter: Part | None,
    shape: Shape,
    hw: HardwareProfile,
    dtype: str,
    *,
    batch: int,
    context: int,
    price: float | None,
    max_batch: int | None = None,
) -> Point:
    plain = step_time(target, hw, dtype, batch=batch, tokens=1, context=context)
    verify = step_time(target, hw, dtype, batch=batch, tokens=shape.verify_tokens, context=context)
    draft = 0.0
    if drafter is not None and shape.draft_passes:
        draft = shape.draft_passes * step_time(
            drafter, hw, dtype, batch=batch, tokens=shape.draft_tokens_per_pass, context=context
        )
    spec = verify + draft
    mem_t = (target.weight_bytes + batch * context * target.kv_bytes_per_token) / (
        hw.memory_bandwidth
    )
    flop_t = (
        batch
        * shape.verify_tokens
        * (2 * target.params + attention_flops_per_token(target.arch, context))
        / hw.flops_for(dtype)
    )
    emitted = batch * shape.tau
    return Point(
        batch=batch,
        fits=max_batch is None or batch <= max_batch,
        plain_step_s=plain,
        spec_step_s=spec,
        verify_s=verify,
        draft_s=draft,
        # a part with no weights on a profile without overheads costs nothing either way
        speedup=shape.tau * plain / spec if spec > 0 else shape.tau,
        plain_tokens_per_s=batch / plain if plain > 0 else None,
        spec_tokens_per_s=emitted / spec if spec > 0 else None,
        bound="compute" if flop_t > mem_t else "memory",
        cost_per_million_plain=_cost(price, plain, batch),
        cost_per_million_emitted=_cost(price, spec, emitted),
        cost_per_million_accepted_draft=_cost(price, spec, batch * (shape.tau - 1.0)),
    )


def max_batch(
    hw: HardwareProfile,
    parts: list[Part],
    context: int,
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
) -> int:
    """Largest number of sequences whose KV caches fit beside the weights (0 if the
    weights alone do not fit). Activations and fragmentation are ignored."""
    free = hw.memory_bytes * memory_fraction - sum(p.weight_bytes for p in parts)
    per_seq = context * sum(p.kv_bytes_per_token for p in parts)
    if free <= 0:
        return 0
    if per_seq <= 0:
        return MAX_BATCH_SEARCH
    return min(int(free // per_seq), MAX_BATCH_SEARCH)


def break_even_batch(speedup_at, limit: int) -> int | None:  # speedup_at: Callable[[int], float]
    """Smallest batch in [1, limit] whose speed-up is below 1, or None if there is none.

    Assumes speed-up does not rise again once it fell below 1 (true of the roofline model:
    the verification pass only gets relatively dearer as the batch grows)."""
    if limit < 1:
        return None
    if speedup_at(1) < 1:
        return 1
    lo, hi = 1, 2
    while hi <= limit and speedup_at(hi) >= 1:
        lo, hi = hi, hi * 2
    if hi > limit:
        if speedup_at(limit) >= 1:
            return None
        hi = limit
    while hi - lo > 1:  # speedup(lo) >= 1 > speedup(hi)
        mid = (lo + hi) // 2
        if speedup_at(mid) >= 1:
            lo = mid
        else:
            hi = mid
    return hi


def draft_memory_fraction(
    hw: HardwareProfile,
    drafter: Part | None,
    batch: int,
    context: int,
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
) -> float:
    """Share of the planned memory the drafter takes: its weights plus its KV cache for
    ``batch`` sequences at ``context`` tokens."""
    if drafter is None:
        return 0.0
    used = drafter.weight_bytes + batch * context * drafter.kv_bytes_per_token
    return used / (hw.memory_bytes * memory_fraction)


def measured_prediction(
    tau: float, plain_call_s: float, verify_call_s: float, draft_step_s: float
) -> float:
    """The same formula with the step costs the runner timed (batch 1, the measuring
    machine): τ · t_plain / (t_verify + t_draft)."""
    den = verify_call_s + draft_step_s
    return math.nan if den <= 0 else tau * plain_call_s / den
