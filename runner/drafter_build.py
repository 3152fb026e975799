"""Constructing a drafter for a pair method: one place for measurement and serving.

``build_drafter`` turns (method, drafter directory, tree shape) into a drafter object the
engine runs, after checking the drafter fits the loaded target. Anything that builds an
engine calls it, so a method or tree behaves the same when measured and when served.
"""

from __future__ import annotations

from typing import Any

import torch

from runner.drafters import DraftModelDrafter, MedusaDrafter, PromptLookupDrafter
from runner.eagle import eagle_type, load_eagle
from runner.eagle_drafter import EagleDrafter
from runner.medusa import is_medusa_dir, load_medusa
from runner.models import load_causal_lm, resolve_dtype
from runner.tree import ProbFn, StaticTree, tree_shape

TREE_METHODS = ("medusa", "eagle", "eagle3")


def build_drafter(
    method: str,
    drafter_dir: str | None,
    target,
    *,
    k: int,
    tree: dict[str, Any] | None = None,
    probs: ProbFn | None = None,
    generator: torch.Generator | None = None,
    dtype: str = "float32",
    max_ngram: int = 3,
    min_ngram: int = 1,
) -> tuple[Any, int]:
    """``(drafter or None, effective k)`` for ``method``; ``probs`` is None when greedy.

    ``k`` is the chain length, or the tree depth when ``tree`` is given (a pair config's
    normalised ``tree`` value). Raises ``ValueError`` when the drafter does not fit.
    """
    device = next(target.parameters()).device
    shape = tree_shape(tree)
    if shape is not None and method not in TREE_METHODS:
        raise ValueError(f"method {method!r} drafts chains only; token trees need heads")
    if method == "none":
        return None, 0
    if method == "prompt_lookup":
        return PromptLookupDrafter(max_ngram, min_ngram), k
    if not drafter_dir:
        raise ValueError(f"method {method!r} needs a drafter directory")
    if method == "draft_model":
        draft = load_causal_lm(drafter_dir, device, dtype)
        if draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"vocab mismatch: target {target.config.vocab_size}, "
                f"draft {draft.config.vocab_size}"
            )
        return DraftModelDrafter(draft, probs, generator), k
    if method == "medusa":
        if not is_medusa_dir(drafter_dir):
            raise ValueError(f"{drafter_dir} holds no Medusa heads (no medusa_num_heads)")
        heads = load_medusa(drafter_dir).to(device=device, dtype=resolve_dtype(dtype))
        if heads.hidden_size != target.config.hidden_size:
            raise ValueError(
                f"Medusa hidden size {heads.hidden_size} != target {target.config.hidden_size}"
            )
        if shape is not None and not isinstance(shape, StaticTree):
            raise ValueError("Medusa heads take a static tree (choices), not a dynamic one")
        return MedusaDrafter(heads, probs, generator, shape), min(k, heads.num_heads)
    if method in ("eagle", "eagle3"):
        kind = eagle_type(drafter_dir)
        if kind != method:
            raise ValueError(
                f"{drafter_dir} is not an {method} head (speculators_model_type={kind!r})"
            )
        head = load_eagle(drafter_dir).to(device=device, dtype=resolve_dtype(dtype))
        return EagleDrafter(head, target, probs, generator, shape), k
    raise ValueError(f"the runner has no drafter for method {method!r}")
