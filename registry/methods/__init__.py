"""Speculation methods and acceptance rules: the one home of these domain rules.

Each method is one object (:class:`~registry.methods.base.SpeculationMethod`) in one module
of this package: its config defaults and checks, the trees it takes, the drafter it needs
and what must fit, its drafter passes for the economics, and its export to vLLM, SGLang
and speculators. :data:`TABLE` lists them; every switch on a method's name happens here,
through :func:`method`. The registry checks pair configs against this table and the runner
executes them, so both read it from here (standard library and ``registry.errors`` only,
which is why the runner may import it although it may not touch the rest of the
registry). Adding a method: a module with its ``METHOD`` object, its line in
:data:`TABLE`, and its tests (for one the embedded runner executes, also its drafter in
``runner/build.py``'s table); see docs/architecture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from registry.errors import InvalidInput
from registry.methods import draft_model, eagle, eagle3, medusa, mtp, prompt_lookup
from registry.methods.base import SpeculationMethod
from registry.methods.prompt_lookup import PROMPT_LOOKUP_DEFAULTS
from registry.methods.trees import MAX_TREE_NODES, TREE_KINDS, normalise_tree

# The method table, in the order the API and the CLI list methods.
TABLE: dict[str, SpeculationMethod] = {
    m.name: m
    for m in (
        draft_model.METHOD,
        prompt_lookup.METHOD,
        medusa.METHOD,
        eagle.METHOD,
        eagle3.METHOD,
        mtp.METHOD,
    )
}
METHODS: tuple[str, ...] = tuple(TABLE)
if TYPE_CHECKING:
    Method = str
else:  # the table's names as a Literal: pydantic and the CLI validate and list them
    Method = Literal[METHODS]

# Names other tools use for the same method.
METHOD_ALIASES: dict[str, str] = {a: m.name for m in TABLE.values() for a in m.aliases}
# Methods whose drafter reads the target's hidden states (heads, not a model of its own).
HEAD_METHODS: frozenset[str] = frozenset(n for n, m in TABLE.items() if m.reads_hidden_states)
# Methods that propose tokens without any drafter artifact.
MODEL_FREE_METHODS: frozenset[str] = frozenset(n for n, m in TABLE.items() if m.drafter == "none")
# What the embedded runner can measure and serve (the others are registered and exported
# for serving engines, but measuring them needs an engine pairreg lacks).
RUNNABLE_METHODS: tuple[str, ...] = tuple(n for n, m in TABLE.items() if m.runnable)
# Methods that can draft a token tree instead of a chain (``tree`` in the pair config).
TREE_METHODS: tuple[str, ...] = tuple(n for n, m in TABLE.items() if m.takes_tree)
# speculators_model_type / algorithm -> method
SPECULATORS_TYPES: dict[str, str] = {t: m.name for m in TABLE.values() for t in m.speculators_types}

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

DType = Literal["float32", "float16", "bfloat16"]
DTYPES: tuple[str, ...] = get_args(DType)

__all__ = [
    "ACCEPTANCE_RULES",
    "DTYPES",
    "HEAD_METHODS",
    "MAX_TREE_NODES",
    "METHODS",
    "METHOD_ALIASES",
    "MODEL_FREE_METHODS",
    "PROMPT_LOOKUP_DEFAULTS",
    "RUNNABLE_METHODS",
    "SPECULATORS_TYPES",
    "TABLE",
    "TREE_KINDS",
    "TREE_METHODS",
    "TYPICAL_DEFAULTS",
    "TYPICAL_DELTA",
    "TYPICAL_EPSILON",
    "AcceptanceRule",
    "DType",
    "Method",
    "SpeculationMethod",
    "canonical_method",
    "is_lossy",
    "get_method",
    "normalise_tree",
]


def canonical_method(name: str) -> str:
    """The registry's name for a method, accepting the aliases other tools use."""
    return METHOD_ALIASES.get(name, name)


def get_method(name: str) -> SpeculationMethod:
    """The method object named ``name`` (aliases: :func:`canonical_method` first); bad input
    names the ``method`` field."""
    found = TABLE.get(name) if isinstance(name, str) else None
    if found is None:
        raise InvalidInput(f"method must be one of {', '.join(METHODS)}", field="method")
    return found


def is_lossy(acceptance: str) -> bool:
    """Only the strict rule reproduces the target's distribution exactly."""
    return acceptance != "strict"
