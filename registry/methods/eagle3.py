"""EAGLE-3: a head that reads three target layers (``aux_layer_ids``, by default
``(2, L/2, L-3)``) and may draft over a reduced vocabulary; trees as EAGLE-1.

Beyond the heads' hidden-size and vocabulary checks, the layers it reads must exist in
the target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from registry.methods.base import SpeculationMethod


@dataclass(frozen=True)
class Eagle3(SpeculationMethod):
    def head_fit_errors(self, tf: Mapping[str, Any], df: Mapping[str, Any]) -> list[str]:
        errors = super().head_fit_errors(tf, df)
        spec = df.get("speculators") or {}
        n_layers = tf.get("num_layers")
        if not n_layers:
            return errors
        ids = spec.get("aux_layer_ids")
        if ids:
            bad = [i for i in ids if not 0 <= i < n_layers]
            if bad:
                errors.append(
                    f"layer count mismatch: the EAGLE-3 head reads target layers {ids}, "
                    f"the target has {n_layers}"
                )
        elif n_layers < 3:
            errors.append(
                f"layer count mismatch: an EAGLE-3 head without layer ids reads layers "
                f"(2, L/2, L-3); the target has {n_layers}"
            )
        return errors


METHOD = Eagle3(
    name="eagle3",
    title="EAGLE-3",
    fuses_target_layers=True,
    drafter="heads",
    drafter_roles=("heads", "draft"),
    draft_passes="per_token",
    runnable=True,
    defaults={"tree": None},
    tree_kinds=("static", "dynamic"),
    vllm_method="eagle3",
    vllm_static_tree=True,
    sglang_algorithm="EAGLE3",
    speculators_types=("eagle3",),
    speculators_model_type="eagle3",
    speculators_exclusive=True,
)
