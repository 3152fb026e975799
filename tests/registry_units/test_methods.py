"""The runner and the registry read one table of methods and acceptance defaults.

A pair registered with typical acceptance and no explicit parameters must be measured with
exactly the parameters the registry stored for it; these tests fail if either side grows
its own copy of a default again (the runner once had epsilon and delta swapped).
"""

from __future__ import annotations

import dataclasses

from registry import methods
from registry.governance.policy import measurement_settings
from registry.services.pairs import normalise_config
from runner.engine import DecodeOptions
from runner.settings import METHODS as RUNNER_METHODS
from runner.settings import MeasureSettings


def test_typical_defaults_follow_medusa_and_vllm() -> None:
    # Medusa/vLLM: posterior_threshold (epsilon) 0.09, posterior_alpha (delta) 0.3.
    assert methods.TYPICAL_DEFAULTS["typical_epsilon"] == 0.09
    assert methods.TYPICAL_DEFAULTS["typical_delta"] == 0.3


def test_runner_defaults_equal_registry_defaults() -> None:
    s = MeasureSettings(method="draft_model", acceptance="typical")
    o = DecodeOptions(k=4, max_new_tokens=8, acceptance="typical")
    for key in ("typical_epsilon", "typical_delta", "strict_prefix_tokens"):
        assert getattr(s, key) == methods.TYPICAL_DEFAULTS[key], key
        assert getattr(o, key) == methods.TYPICAL_DEFAULTS[key], key
    assert s.max_ngram == methods.PROMPT_LOOKUP_DEFAULTS["prompt_lookup_max"]
    assert s.min_ngram == methods.PROMPT_LOOKUP_DEFAULTS["prompt_lookup_min"]


def test_a_registered_typical_pair_is_measured_with_its_stored_parameters() -> None:
    config = normalise_config("draft_model", 4, {"acceptance": "typical"})
    settings = measurement_settings(config, {"temperature": 0.0, "max_new_tokens": 8})
    runner = MeasureSettings(**settings)
    assert runner.typical_epsilon == config["typical_epsilon"] == 0.09
    assert runner.typical_delta == config["typical_delta"] == 0.3
    assert runner.lossy is True


def test_runner_methods_are_registry_methods_plus_plain_decoding() -> None:
    assert set(RUNNER_METHODS) == set(methods.RUNNABLE_METHODS) | {"none"}
    assert set(methods.RUNNABLE_METHODS) <= set(methods.METHODS)
    assert MeasureSettings(method="ngram").method == "prompt_lookup"


def test_every_pair_config_key_the_runner_reads_maps_to_a_runner_field() -> None:
    config = normalise_config("prompt_lookup", 3, {"acceptance": "typical", "prompt_lookup_max": 4})
    settings = measurement_settings(config, {})
    fields = {f.name for f in dataclasses.fields(MeasureSettings)}
    assert set(settings) <= fields
    assert MeasureSettings(**settings).max_ngram == 4


def test_a_registered_tree_reaches_the_runner_unchanged() -> None:
    tree = {"top_k": 3, "total_tokens": 10}
    config = normalise_config("eagle3", 4, {"tree": tree})
    runner = MeasureSettings(**measurement_settings(config, {"temperature": 1.0}))
    assert runner.tree == config["tree"] == {"kind": "dynamic", **tree}
    assert runner.method == "eagle3" and runner.k == 4
    assert set(methods.TREE_METHODS) <= set(methods.RUNNABLE_METHODS)
    chain = measurement_settings(normalise_config("medusa", 3, {}), {})
    assert "tree" not in chain and MeasureSettings(**chain).tree is None
