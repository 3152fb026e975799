"""MTP: the multi-token-prediction layers a model was trained with (DeepSeek-V3, Qwen3-Next
…), one pass per drafted token. Registered and exported for vLLM; the embedded runner does
not execute it and SGLang's launch flags have no algorithm for it here.
"""

from __future__ import annotations

from registry.methods.base import SpeculationMethod

METHOD = SpeculationMethod(
    name="mtp",
    title="MTP",
    drafter="heads",
    drafter_roles=("heads", "draft"),
    draft_passes="per_token",
    vllm_method="mtp",
    speculators_types=("mtp",),
)
