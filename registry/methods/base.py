"""What a speculation method is: one object holding everything that differs per method.

Config normalisation (defaults, optional keys, method-specific checks, which token trees
it takes), compatibility (which drafter it needs, whether the drafter reads the target's
hidden states and what must fit), economics (drafter passes per step) and the export
mapping to vLLM, SGLang and speculators all read the method object, so no code outside
the method table switches on a method's name. Standard library and
:mod:`registry.errors` only: the runner reads these objects too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from registry.errors import InvalidInput

# What a pair's drafter artifact is: a causal LM of its own, heads on the target's hidden
# states, or nothing (proposals come from the prompt itself).
DrafterKind = Literal["model", "heads", "none"]
# Forward passes of the drafter per decoding step: one per drafted token, one for all of
# them (Medusa's parallel heads), or none (a host-side search).
DraftPasses = Literal["per_token", "one", "none"]


@dataclass(frozen=True)
class SpeculationMethod:
    """One speculation method. Subclass it for behaviour the fields cannot say."""

    name: str
    title: str
    drafter: DrafterKind
    # artifact roles the drafter may have (empty: no drafter at all)
    drafter_roles: tuple[str, ...]
    draft_passes: DraftPasses
    # whether the embedded runner can measure and serve it (the others are registered and
    # exported for serving engines); the runner builds its drafter from runner/build.py's
    # table, keyed by :attr:`name`
    runnable: bool = False
    # config keys with their defaults; keys it accepts without a default (absent from the
    # normalised config unless set, so older pairs' digests do not change)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    optional_keys: tuple[str, ...] = ()
    # token trees it can draft (``static``, ``dynamic``); empty: chains only
    tree_kinds: tuple[str, ...] = ()
    # names other tools use for it
    aliases: tuple[str, ...] = ()
    # export: vLLM's ``speculative_config.method``, whether vLLM takes its static trees
    # (``speculative_token_tree``), SGLang's ``--speculative-algorithm`` (None: none)
    vllm_method: str | None = None
    vllm_static_tree: bool = False
    sglang_algorithm: str | None = None
    # speculators: the ``speculators_model_type`` / ``algorithm`` values that name this
    # method; the type an export writes when the drafter's config names none; whether a
    # speculators drafter of this type must be registered under this method
    speculators_types: tuple[str, ...] = ()
    speculators_model_type: str | None = None
    speculators_exclusive: bool = False
    # whether its head fuses several target layers (EAGLE-3's auxiliary hidden states): the
    # layer ids are then part of the configuration a pair is measured and served under
    fuses_target_layers: bool = False

    @property
    def reads_hidden_states(self) -> bool:
        """Heads run on the target's hidden states (hidden size and vocabulary must fit)."""
        return self.drafter == "heads"

    @property
    def takes_tree(self) -> bool:
        return bool(self.tree_kinds)

    # --- config -------------------------------------------------------------------------

    def check_config(self, config: dict[str, Any]) -> None:
        """Method-specific checks of a config whose keys and common values are checked;
        may normalise values in place. Raises :class:`InvalidInput` naming the field."""

    # --- compatibility ------------------------------------------------------------------

    def head_fit_errors(self, tf: Mapping[str, Any], df: Mapping[str, Any]) -> list[str]:
        """Structural reasons this method's drafter cannot run on a target (target facts
        ``tf``, drafter facts ``df``): for heads, hidden size and vocabulary."""
        if not self.reads_hidden_states:
            return []
        errors: list[str] = []
        th, dh = tf.get("hidden_size"), reads_hidden_size(df)
        if th and dh and th != dh:
            errors.append(f"hidden size mismatch: heads read {dh}, target has {th}")
        tv, dv = tf.get("vocab_size"), df.get("vocab_size")
        if tv and dv and tv != dv:
            errors.append(f"vocabulary size mismatch: heads emit {dv}, target has {tv}")
        return errors

    # --- economics ----------------------------------------------------------------------

    def drafter_passes(self, k: int) -> int:
        """Forward passes of the drafter per decoding step."""
        return {"per_token": k, "one": 1, "none": 0}[self.draft_passes]

    def draft_tokens_per_pass(self, drafted: float, k: int) -> float:
        """Tokens per sequence one drafter pass handles (a tree: its nodes over k levels)."""
        if self.draft_passes == "one":
            return 1.0
        return drafted / k if k else 0.0

    # --- export -------------------------------------------------------------------------

    def vllm_options(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Method-specific keys of vLLM's ``speculative_config`` (beyond method, k, model)."""
        return {}


def reads_hidden_size(df: Mapping[str, Any]) -> int | None:
    """The hidden size a head reads from its target (EAGLE-3 may name it apart)."""
    spec = df.get("speculators") or {}
    return spec.get("target_hidden_size") or df.get("hidden_size")


def check_int(config: dict[str, Any], key: str, lo: int, hi: int) -> None:
    if key in config:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise InvalidInput(f"{key} must be an integer from {lo} to {hi}", field=key)


def check_number(config: dict[str, Any], key: str, lo: float, hi: float) -> None:
    if key in config:
        value = config[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
            raise InvalidInput(f"{key} must be a number from {lo} to {hi}", field=key)
        config[key] = float(value)
