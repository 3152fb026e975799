"""Records the economics operations return (see :mod:`registry.services.economics`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class HardwareRecord(BaseModel):
    name: str
    description: str
    kind: str = Field(description="shipped (vendor datasheet), measured or user.")
    memory_bytes: float
    memory_bandwidth: float = Field(description="Bytes per second.")
    flops: dict[str, float] = Field(description="Dense FLOPS by dtype.")
    price_per_hour: float | None
    step_overhead_s: float
    layer_overhead_s: float
    source: str = Field(description="Where each figure comes from.")
    measured_at: str | None = None


class PartFacts(BaseModel):
    role: str
    ref: str
    params: int
    weight_bytes: int = Field(description="At the pair's dtype.")
    kv_bytes_per_token: int
    num_layers: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    flops_per_token: int = Field(description="2 × params + attention at the context length.")
    source: str = Field(description="safetensors headers or file sizes.")


class EconomicsPoint(BaseModel):
    batch: int
    fits: bool = Field(description="The batch's KV caches fit beside the weights.")
    speedup: float = Field(description="Predicted: speculative vs plain tokens/s per sequence.")
    plain_step_s: float
    spec_step_s: float
    verify_s: float
    draft_s: float
    plain_tokens_per_s: float | None
    spec_tokens_per_s: float | None
    bound: str = Field(description="memory or compute: what limits the verification pass.")
    cost_per_million_plain: float | None
    cost_per_million_emitted: float | None
    cost_per_million_accepted_draft: float | None


class MeasuredEconomics(BaseModel):
    """What the runner timed at batch 1 on its own machine, and the model's prediction."""

    measurement_id: int
    hardware: dict[str, Any]
    speedup_measured: float | None
    speedup_predicted: float | None = Field(
        description="τ · t_plain / (t_verify + t_draft) from the step times the runner measured."
    )
    prediction_error: float | None = Field(description="predicted / measured − 1.")
    cost_ratio_c: float | None
    plain_call_s: float | None
    verify_call_s: float | None
    draft_step_s: float | None
    target_s_by_tokens: dict[str, float] = Field(
        description="Mean target pass time by tokens verified in the pass."
    )


class EconomicsReport(BaseModel):
    pair_id: int
    pair_digest: str
    method: str
    k: int
    tree: bool
    dtype: str
    tau: float
    tau_source: str
    hardware: HardwareRecord
    context: int
    price_per_hour: float | None
    memory_fraction: float
    target: PartFacts
    drafter: PartFacts | None
    max_batch_plain: int = Field(description="Largest batch that fits with the target alone.")
    max_batch_spec: int = Field(description="Largest batch that fits with the drafter too.")
    draft_memory_fraction: float = Field(
        description="Drafter weights + its KV cache at max_batch_spec, over planned memory."
    )
    break_even_batch: int | None = Field(
        description="Smallest batch (up to max_batch_spec) where speed-up < 1; null if none."
    )
    points: list[EconomicsPoint]
    measured: MeasuredEconomics | None
    compare: EconomicsReport | None = None
    notes: list[str] = Field(default_factory=list)


class HardwareList(BaseModel):
    items: list[HardwareRecord]
