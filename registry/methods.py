"""Speculation methods and acceptance rules: the one home of these domain rules.

The registry checks pair configs against this table and the runner executes them, so both
read it from here (it is pure data, standard library only, which is why the runner may
import it although it may not touch the rest of the registry). Changing a default here
changes it everywhere; ``tests/registry_units/test_methods.py`` holds the runner to it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

Method = Literal["draft_model", "prompt_lookup", "medusa", "eagle", "eagle3", "mtp"]
METHODS: tuple[str, ...] = get_args(Method)

# Methods whose drafter reads the target's hidden states (heads, not a model of its own).
HEAD_METHODS: frozenset[str] = frozenset({"medusa", "eagle", "eagle3", "mtp"})
# Methods that propose tokens without any drafter artifact.
MODEL_FREE_METHODS: frozenset[str] = frozenset({"prompt_lookup"})
# What the embedded runner can measure and serve (the others are registered and exported
# for serving engines, but measuring them needs an engine pairreg lacks).
RUNNABLE_METHODS: tuple[str, ...] = ("draft_model", "prompt_lookup", "medusa")
# Names other tools use for the same method.
METHOD_ALIASES: dict[str, str] = {"ngram": "prompt_lookup"}

AcceptanceRule = Literal["strict", "typical"]
ACCEPTANCE_RULES: tuple[str, ...] = get_args(AcceptanceRule)

# Typical acceptance (Medusa; vLLM's typical-acceptance sampler): accept a draft token x when
# p(x) > min(epsilon, delta * exp(-H(p))). Medusa and vLLM ship posterior_threshold 0.09
# (epsilon) and posterior_alpha 0.3 (delta). ``strict_prefix_tokens`` verifies the first N
# output tokens with the exact rule before the lossy one takes over.
TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3
TYPICAL_DEFAULTS: dict[str, Any] = {
    "typical_epsilon": TYPICAL_EPSILON,
    "typical_delta": TYPICAL_DELTA,
    "strict_prefix_tokens": 0,
}

# Prompt lookup (n-gram): match the last n tokens for n from max down to min.
PROMPT_LOOKUP_DEFAULTS: dict[str, Any] = {"prompt_lookup_max": 3, "prompt_lookup_min": 1}

DType = Literal["float32", "float16", "bfloat16"]
DTYPES: tuple[str, ...] = get_args(DType)


def canonical_method(name: str) -> str:
    """The registry's name for a method, accepting the aliases other tools use."""
    return METHOD_ALIASES.get(name, name)


def is_lossy(acceptance: str) -> bool:
    """Only the strict rule reproduces the target's distribution exactly."""
    return acceptance != "strict"
