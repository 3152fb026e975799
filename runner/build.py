"""``build_engine``: the one place a pair's config and local directories become a runnable
speculative engine, for measurement and for serving alike.

Both paths must build the same drafter with the same checks (vocabulary, hidden size, head
count), or a served pair could behave differently from the measured one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from registry.artifacts.tokenizer_compat import MAX_PADDING
from registry.methods import TREE_METHODS
from runner.drafters import DraftModelDrafter, MedusaDrafter, PromptLookupDrafter
from runner.eagle import eagle_type, load_eagle
from runner.eagle_drafter import EagleDrafter
from runner.engine import DecodeOptions, SpeculativeEngine
from runner.medusa import load_medusa
from runner.models import eos_ids, load_causal_lm, load_tokenizer, resolve_device, resolve_dtype
from runner.sampling import probs_from_logits
from runner.settings import MeasureSettings
from runner.tree import StaticTree, tree_shape


@dataclass
class BuiltEngine:
    """A loaded pair: the tokenizer, the target model and the engine that drives both."""

    tokenizer: Any
    target: Any
    engine: SpeculativeEngine
    generator: torch.Generator
    device: torch.device
    k: int
    eos: set[int]


# One drafter factory per method the runner executes, keyed by the method object's name
# (registry/methods/); ``none`` is the plain target, the baseline of every speed-up.
# Each factory gets the settings, the drafter directory, the loaded target, the device, the
# generator, the sampling probabilities (None: greedy) and the tree shape (None: a chain),
# and returns the drafter and the tokens it drafts per step.
DrafterFactory = Callable[..., tuple[Any, int]]


def _draft_model(s, drafter_dir, target, device, generator, prob_fn, shape) -> tuple[Any, int]:
    if not drafter_dir:
        raise ValueError("method 'draft_model' needs a drafter directory")
    draft_model = load_causal_lm(drafter_dir, device, s.dtype, s.trust_remote_code)
    tv, dv = target.config.vocab_size, draft_model.config.vocab_size
    if not tv <= dv <= tv + MAX_PADDING:  # the registry's rule: padding up to 128 ids
        raise ValueError(f"vocab mismatch: target {tv}, draft {dv}")
    vocab = tv if dv > tv else None
    return DraftModelDrafter(draft_model, prob_fn, generator, vocab), s.k


def _medusa(s, drafter_dir, target, device, generator, prob_fn, shape) -> tuple[Any, int]:
    if not drafter_dir:
        raise ValueError("method 'medusa' needs a heads directory")
    heads = load_medusa(drafter_dir).to(device=device, dtype=resolve_dtype(s.dtype))
    if heads.hidden_size != target.config.hidden_size:
        raise ValueError(
            f"Medusa hidden size {heads.hidden_size} != target {target.config.hidden_size}"
        )
    if shape is not None and not isinstance(shape, StaticTree):
        raise ValueError("Medusa heads take a static tree (choices), not a dynamic one")
    return MedusaDrafter(heads, prob_fn, generator, shape), min(s.k, heads.num_heads)


def _eagle(s, drafter_dir, target, device, generator, prob_fn, shape) -> tuple[Any, int]:
    """EAGLE-1 and EAGLE-3: one loader, the head's speculators type must be the method."""
    if not drafter_dir:
        raise ValueError(f"method {s.method!r} needs a heads directory")
    kind = eagle_type(drafter_dir)
    if kind != s.method:
        raise ValueError(
            f"{drafter_dir} is not an {s.method} head (speculators_model_type={kind!r})"
        )
    head = load_eagle(drafter_dir).to(device=device, dtype=resolve_dtype(s.dtype))
    return EagleDrafter(head, target, prob_fn, generator, shape), s.k


def _prompt_lookup(s, drafter_dir, target, device, generator, prob_fn, shape) -> tuple[Any, int]:
    return PromptLookupDrafter(s.max_ngram, s.min_ngram), s.k


def _none(s, drafter_dir, target, device, generator, prob_fn, shape) -> tuple[Any, int]:
    return None, 0


DRAFTERS: dict[str, DrafterFactory] = {
    "draft_model": _draft_model,
    "prompt_lookup": _prompt_lookup,
    "medusa": _medusa,
    "eagle": _eagle,
    "eagle3": _eagle,
    "none": _none,
}


def build_drafter(
    s: MeasureSettings, drafter_dir: str | None, target: Any, device: torch.device, generator
) -> tuple[Any, int]:
    """The drafter for ``s.method`` and the effective number of drafted tokens per step
    (for a token tree, ``s.tree``: its depth)."""
    prob_fn = None if s.temperature <= 0 else _prob_fn(s)
    shape = tree_shape(s.tree)
    if shape is not None and s.method not in TREE_METHODS:
        raise ValueError(f"method {s.method!r} drafts chains only; token trees need heads")
    factory = DRAFTERS.get(s.method)
    if factory is None:
        raise ValueError(f"the runner cannot build method {s.method!r}")
    return factory(s, drafter_dir, target, device, generator, prob_fn, shape)


def _prob_fn(s: MeasureSettings):  # -> Callable[[Tensor], Tensor]
    def probs(logits: torch.Tensor) -> torch.Tensor:
        return probs_from_logits(logits, s.temperature, s.top_k, s.top_p)

    return probs


def build_engine(
    settings: MeasureSettings, target_dir: str, drafter_dir: str | None = None
) -> BuiltEngine:
    """Load the target (and drafter) from verified local directories into one engine."""
    s = settings
    device = resolve_device(s.device)
    if s.num_threads:
        torch.set_num_threads(s.num_threads)
    tokenizer = load_tokenizer(target_dir, s.trust_remote_code)
    target = load_causal_lm(target_dir, device, s.dtype, s.trust_remote_code)
    generator = torch.Generator(device=device)
    drafter, k = build_drafter(s, drafter_dir, target, device, generator)
    options = DecodeOptions(
        k=k,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        acceptance=s.acceptance,
        typical_epsilon=s.typical_epsilon,
        typical_delta=s.typical_delta,
        strict_prefix_tokens=s.strict_prefix_tokens,
        full_last_draft=s.full_last_draft,
    )
    eos = eos_ids(target, tokenizer)
    engine = SpeculativeEngine(target, drafter, options, eos, generator)
    return BuiltEngine(tokenizer, target, engine, generator, device, k, eos)
