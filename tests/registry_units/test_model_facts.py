"""Architecture facts and declared targets from config.json and the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.artifacts.model_facts import ModelFactsError, read_model_facts


def _write(d: Path, config: dict | None = None, readme: str | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if readme is not None:
        (d / "README.md").write_text(readme)
    return d


def test_plain_llama(tmp_path: Path) -> None:
    f = read_model_facts(
        _write(
            tmp_path,
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 4096,
                "vocab_size": 128256,
                "num_hidden_layers": 32,
            },
        )
    )
    assert (f.model_type, f.architectures, f.hidden_size, f.vocab_size, f.num_layers) == (
        "llama",
        ["LlamaForCausalLM"],
        4096,
        128256,
        32,
    )
    assert f.declared_targets == [] and f.has_config


def test_nested_text_config(tmp_path: Path) -> None:
    f = read_model_facts(
        _write(
            tmp_path,
            {
                "model_type": "llava",
                "architectures": ["LlavaForConditionalGeneration"],
                "text_config": {
                    "model_type": "llama",
                    "hidden_size": 2048,
                    "vocab_size": 32064,
                    "num_hidden_layers": 22,
                },
            },
        )
    )
    assert (f.model_type, f.hidden_size, f.vocab_size, f.num_layers) == ("llava", 2048, 32064, 22)


def test_speculators_and_card(tmp_path: Path) -> None:
    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "speculators_config": {
            "algorithm": "eagle3",
            "verifier": {"name_or_path": "acme/chat-8b", "architectures": ["LlamaForCausalLM"]},
        },
        "hidden_size": 4096,
    }
    readme = "---\nlicense: apache-2.0\nbase_model:\n- acme/chat-8b-base\n---\n# Draft\n"
    f = read_model_facts(_write(tmp_path, config, readme))
    assert [t.to_dict() for t in f.declared_targets] == [
        {
            "source_field": "config.speculators_config.verifier.name_or_path",
            "value": "acme/chat-8b",
            "architectures": ["LlamaForCausalLM"],
        },
        {"source_field": "README.base_model", "value": "acme/chat-8b-base"},
    ]


def test_medusa_and_eagle_keys(tmp_path: Path) -> None:
    medusa = read_model_facts(
        _write(
            tmp_path / "medusa",
            {
                "medusa_num_heads": 4,
                "medusa_num_layers": 1,
                "base_model_name_or_path": "lmsys/vicuna-7b-v1.3",
                "hidden_size": 4096,
            },
        )
    )
    assert (medusa.medusa_num_heads, medusa.medusa_num_layers, medusa.model_type) == (4, 1, None)
    assert [(t.source_field, t.value) for t in medusa.declared_targets] == [
        ("config.base_model_name_or_path", "lmsys/vicuna-7b-v1.3")
    ]
    eagle = read_model_facts(
        _write(tmp_path / "eagle", {"base_model": "acme/t", "model_type": "llama"})
    )
    assert [(t.source_field, t.value) for t in eagle.declared_targets] == [
        ("config.base_model", "acme/t")
    ]


def test_no_config_and_bad_inputs(tmp_path: Path) -> None:
    f = read_model_facts(_write(tmp_path / "empty", readme="---\nbase_model: acme/t\n---\n"))
    assert not f.has_config and f.model_type is None and f.hidden_size is None
    assert [t.value for t in f.declared_targets] == ["acme/t"]

    bad_card = read_model_facts(_write(tmp_path / "card", {"model_type": "x"}, "---\n: : [\n---\n"))
    assert bad_card.model_type == "x" and bad_card.warnings

    d = _write(tmp_path / "bad")
    (d / "config.json").write_text('{"model_type": ')
    with pytest.raises(ModelFactsError, match="not valid JSON"):
        read_model_facts(d)
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelFactsError, match="JSON object"):
        read_model_facts(d)
