"""Measurement settings: everything that changes the numbers goes here, so a stored
measurement can say exactly how it was taken."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from registry.methods import (
    ACCEPTANCE_RULES,
    PROMPT_LOOKUP_DEFAULTS,
    RUNNABLE_METHODS,
    TREE_METHODS,
    TYPICAL_DELTA,
    TYPICAL_EPSILON,
    canonical_method,
    is_lossy,
)

# What the runner executes: the runnable pair methods, plus ``none`` (the plain target,
# tau = 1, the baseline every speed-up is measured against).
METHODS = (*RUNNABLE_METHODS, "none")


@dataclass
class MeasureSettings:
    """How to run a pair.

    ``method``: ``draft_model`` | ``prompt_lookup`` | ``medusa`` | ``eagle`` | ``eagle3`` |
    ``none`` (plain target, tau = 1 baseline). ``k``: tokens drafted per step, or the tree
    depth when ``tree`` is set (Medusa: capped at its head count). ``tree``: a pair
    config's tree (``{"kind": "static", "choices": [[0], [1], [0, 0], ...]}`` or
    ``{"kind": "dynamic", "top_k": K, "total_tokens": N}``), strict acceptance only.
    ``trust_remote_code``: run model code that ships with a checkpoint (``auto_map``);
    only set when the policy names the lineage. ``temperature=0`` means greedy.
    ``full_last_draft``: count the last steps as vLLM does: a full ``k`` is drafted and
    verified even when fewer tokens are left in the budget (the tokens past
    ``max_new_tokens`` or an end token are counted, never emitted), so per-request counters
    compare like for like with an engine's; off, the last draft is trimmed to the budget
    and nothing past it is counted.
    ``acceptance="typical"`` is lossy (Medusa typical
    acceptance with ``typical_epsilon``/``typical_delta``); ``strict_prefix_tokens`` verifies
    the first N output tokens strictly before switching to the lossy rule.
    """

    method: str = "draft_model"
    k: int = 4
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 64
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    acceptance: str = "strict"
    typical_epsilon: float = TYPICAL_EPSILON
    typical_delta: float = TYPICAL_DELTA
    strict_prefix_tokens: int = 0
    max_ngram: int = PROMPT_LOOKUP_DEFAULTS["prompt_lookup_max"]
    min_ngram: int = PROMPT_LOOKUP_DEFAULTS["prompt_lookup_min"]
    num_threads: int | None = None
    tree: dict[str, Any] | None = None
    trust_remote_code: bool = False
    full_last_draft: bool = False

    def __post_init__(self) -> None:
        self.method = canonical_method(self.method)
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance must be one of {ACCEPTANCE_RULES}")
        if self.k < 0 or (self.k == 0 and self.method != "none"):
            raise ValueError("k must be >= 1 for a speculative method")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError("top_k must be >= 1")
        if self.tree is not None:
            if self.method not in TREE_METHODS:
                raise ValueError(f"tree needs one of {TREE_METHODS}, not {self.method!r}")
            if self.acceptance != "strict":
                raise ValueError("token trees are verified with the strict rule only")

    @property
    def lossy(self) -> bool:
        return is_lossy(self.acceptance)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
