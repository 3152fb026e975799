"""Prompt lookup (n-gram): proposals are copied from the prompt and the output so far,
matching the last n tokens for n from ``prompt_lookup_max`` down to ``prompt_lookup_min``.

No drafter artifact and no drafter pass (a host-side search); vLLM ``ngram``, SGLang
``NGRAM``; ``ngram`` is accepted as its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from registry.errors import InvalidInput
from registry.methods.base import SpeculationMethod, check_int

# match the last n tokens for n from max down to min
PROMPT_LOOKUP_DEFAULTS: dict[str, Any] = {"prompt_lookup_max": 3, "prompt_lookup_min": 1}


@dataclass(frozen=True)
class PromptLookup(SpeculationMethod):
    def check_config(self, config: dict[str, Any]) -> None:
        check_int(config, "prompt_lookup_max", 1, 16)
        check_int(config, "prompt_lookup_min", 1, 16)
        if config["prompt_lookup_min"] > config["prompt_lookup_max"]:
            raise InvalidInput(
                "prompt_lookup_min must not exceed prompt_lookup_max", field="prompt_lookup_min"
            )

    def vllm_options(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "prompt_lookup_max": config.get("prompt_lookup_max"),
            "prompt_lookup_min": config.get("prompt_lookup_min"),
        }


METHOD = PromptLookup(
    name="prompt_lookup",
    title="prompt lookup",
    drafter="none",
    drafter_roles=(),
    draft_passes="none",
    runnable=True,
    defaults=PROMPT_LOOKUP_DEFAULTS,
    aliases=("ngram",),
    vllm_method="ngram",
    sglang_algorithm="NGRAM",
)
