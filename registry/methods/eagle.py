"""EAGLE-1: a one-layer head that drafts from the target's post-norm last hidden state
and the next token's embedding, one pass per drafted token; chains, static trees (vLLM's
``speculative_token_tree``) or EAGLE-2 dynamic trees (SGLang).
"""

from __future__ import annotations

from registry.methods.base import SpeculationMethod

METHOD = SpeculationMethod(
    name="eagle",
    title="EAGLE-1",
    drafter="heads",
    drafter_roles=("heads", "draft"),
    draft_passes="per_token",
    runnable=True,
    defaults={"tree": None},
    tree_kinds=("static", "dynamic"),
    vllm_method="eagle",
    vllm_static_tree=True,
    sglang_algorithm="EAGLE",
    speculators_types=("eagle",),
    speculators_model_type="eagle",
    speculators_exclusive=True,
)
