"""Medusa: extra decoding heads on the target's last hidden state, one per position ahead,
all computed in one pass; chains or a static tree of candidate ranks (``tree`` optional,
so chain pairs registered before trees existed keep their digests).

vLLM serves Medusa heads as chains only (its tree attention is for EAGLE); SGLang has no
Medusa algorithm.
"""

from __future__ import annotations

from registry.methods.base import SpeculationMethod

METHOD = SpeculationMethod(
    name="medusa",
    title="Medusa",
    drafter="heads",
    drafter_roles=("heads", "draft"),
    draft_passes="one",
    runnable=True,
    optional_keys=("tree",),
    tree_kinds=("static",),
    vllm_method="medusa",
    speculators_types=("medusa",),
)
