"""Draft model: a small causal LM of its own proposes ``k`` tokens, one pass each.

Its vocabulary must match the target's (the registry compares tokenizers; the runner
allows up to 128 padding ids); vLLM ``draft_model``, SGLang ``STANDALONE``.
"""

from __future__ import annotations

from registry.methods.base import SpeculationMethod

METHOD = SpeculationMethod(
    name="draft_model",
    title="draft model",
    drafter="model",
    drafter_roles=("draft",),
    draft_passes="per_token",
    runnable=True,
    vllm_method="draft_model",
    sglang_algorithm="STANDALONE",
    speculators_types=("draft_model", "independent"),
)
