"""The engine backend without an engine: vLLM's per-request counters turned into the
runner's raw rows, what it refuses, and the policy key that trusts engine measurements.
(The same code against a real vLLM: tests/engine/test_engine_worker.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from registry.errors import InvalidInput, PairregError
from registry.governance.policy import DEFAULTS, parse_policy, policy_digest
from runner.serving_config import serving_config
from runner.suites import Prompt
from runner.vllm_measure import (
    EngineError,
    EngineUnavailable,
    VllmClient,
    histogram_row,
    measure_prompts,
)
from tests.api.conftest import run_cli
from tests.serve_process import free_port


def test_histogram_to_per_position_counters() -> None:
    # k = 3; 5 steps: 1 accepted nothing, 1 accepted 1, 1 accepted 2, 2 accepted all 3
    spec = {"num_spec_steps": 5, "num_draft_tokens": 15, "num_accepted_draft_tokens": 9,
            "acceptance_histogram": [1, 1, 1, 2]}  # fmt: skip
    row = histogram_row(spec, 3)
    assert row["accepted_per_position"] == [4, 3, 2]
    assert row["verified_per_position"] == [5, 4, 3]
    assert row["rejections"] == 3  # the three steps that stopped short of k
    assert sum(row["accepted_per_position"]) == spec["num_accepted_draft_tokens"]
    with pytest.raises(EngineError, match="per-request-spec-decode-metrics"):
        histogram_row({**spec, "acceptance_histogram": None}, 3)


class FakeVllm:
    """Answers as vLLM does, from a table of per-prompt speculative counters."""

    url = "http://engine"

    def __init__(self, specs: dict[str, dict[str, Any]], k: int = 2):
        self.specs, self.k = specs, k

    def card(self) -> dict[str, Any]:
        return {"id": "dep", "root": "/models/t", "max_model_len": 1024}

    def version(self) -> str:
        return "0.32.0"

    def ask(self, prompt: Prompt, sampling: dict[str, Any]) -> tuple[dict[str, Any], float]:
        spec = {**self.specs[prompt.id], "num_spec_tokens": self.k}
        n = sampling["max_tokens"]
        return {
            "system_fingerprint": "vllm-0.32.0-abcdef12",
            "choices": [{"token_ids": list(range(n)), "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": n},
            "metrics": {"speculative_decoding": spec},
        }, 0.01


def _spec(steps: int, hist: list[int]) -> dict[str, Any]:
    acc = sum(j * h for j, h in enumerate(hist))
    return {"num_spec_steps": steps, "num_draft_tokens": 2 * steps,
            "num_accepted_draft_tokens": acc, "acceptance_histogram": hist}  # fmt: skip


def test_measure_prompts_summarises_like_the_runner() -> None:
    prompts = [Prompt(id=f"p{i}", category="code" if i < 3 else "chat", prompt="x")
               for i in range(5)]  # fmt: skip
    specs = {"p0": _spec(4, [0, 0, 4]), "p1": _spec(4, [1, 1, 2]), "p2": _spec(5, [2, 2, 1]),
             "p3": _spec(6, [6, 0, 0]), "p4": _spec(6, [4, 2, 0])}  # fmt: skip
    settings = {"method": "draft_model", "k": 2, "max_new_tokens": 8, "temperature": 0.0}
    out = measure_prompts(FakeVllm(specs), prompts, settings)  # type: ignore[arg-type]
    code = out["categories"]["code"]
    # code: accepted 8 + 5 + 4 = 17 of drafted 26
    assert code["draft_acceptance_rate"] == pytest.approx(17 / 26)
    assert code["mean_acceptance_length"] == pytest.approx(1 + 17 / 13)
    assert code["per_position"] == pytest.approx([(4 + 3 + 3) / 13, (4 + 2 + 1) / 13])
    lo, hi = code["draft_acceptance_rate_ci"]
    assert lo <= 17 / 26 <= hi and lo < hi
    assert out["categories"]["chat"]["draft_acceptance_rate"] == pytest.approx(2 / 24)
    engine = out["engine"]
    assert (engine["name"], engine["version"], engine["num_spec_tokens"]) == ("vllm", "0.32.0", 2)
    assert engine["system_fingerprint"] == ["vllm-0.32.0-abcdef12"]
    assert engine["throughput"]["tokens"] == 40 and engine["counting"] == "full_last_draft"

    # another k served than the pair's: not this pair's measurement
    with pytest.raises(EngineError, match="k = 3"):
        measure_prompts(FakeVllm(specs, k=3), prompts, settings)  # type: ignore[arg-type]
    # what vLLM's flags cannot express
    with pytest.raises(InvalidInput, match="strict acceptance"):
        measure_prompts(FakeVllm(specs), prompts, {**settings, "acceptance": "typical"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="medusa"):
        measure_prompts(FakeVllm(specs), prompts, {**settings, "method": "medusa"})  # type: ignore[arg-type]


def test_trust_engines_key() -> None:
    assert parse_policy('name = "p"\n')["trust"]["engines"] == ["runner", "vllm"]
    assert parse_policy('name = "p"\n[trust]\nengines = ["vllm"]\n')["trust"]["engines"] == ["vllm"]
    for bad in ("[]", '["sglang"]', '"vllm"'):
        with pytest.raises(InvalidInput) as exc:
            parse_policy(f'name = "p"\n[trust]\nengines = {bad}\n')
        assert exc.value.field == "trust.engines"
    # a policy that does not use the key keeps the digest it had before the key existed
    plain = parse_policy('name = "p"\n')
    older = {**plain, "trust": {k: v for k, v in plain["trust"].items() if k != "engines"}}
    assert policy_digest(plain) == policy_digest(older)
    signed = parse_policy('name = "p"\n[trust]\nrequire_signature = true\n')
    older_signed = {**signed, "trust": {"measurements": ["job", "local"],
                                        "require_signature": True}}  # fmt: skip
    assert policy_digest(signed) == policy_digest(older_signed)
    assert policy_digest(parse_policy('name = "p"\n[trust]\nengines = ["vllm"]\n')) != (
        policy_digest(plain)
    )
    assert DEFAULTS["trust"]["engines"] == ["runner", "vllm"]


def test_worker_engine_options_refused_readably() -> None:
    cases = (
        (["--engine", "vllm"], "engine-url"),
        (["--engine", "sglang", "--engine-url", "http://x"], "engine"),
        (["--engine-url", "http://x"], "engine-url"),
        (["--engine", "vllm", "--engine-url", "ftp://x"], "engine-url"),
    )
    for args, field in cases:
        result = run_cli("worker", "--once", *args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and f"--{field}" in result.output, result.output


def test_serving_config_reads_template_and_aux_layers(tmp_path: Path) -> None:
    target, head = tmp_path / "t", tmp_path / "h"
    target.mkdir()
    head.mkdir()
    (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    (head / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
    settings = {"method": "eagle3", "k": 4, "dtype": "float32"}
    cfg = serving_config(settings, str(target), str(head), engine="vllm", engine_version="0.32.0")
    assert cfg["chat_template_digest"] == "sha256:" + hashlib.sha256(b"{{ x }}").hexdigest()
    assert cfg["eagle3_aux_layer_ids"] == [1, 2, 3]
    assert (cfg["engine"], cfg["engine_version"], cfg["method"], cfg["k"]) == (
        "vllm",
        "0.32.0",
        "eagle3",
        4,
    )
    # vLLM #50170's case reads differently; so does another template, a .jinja file first
    (head / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}))
    (target / "chat_template.jinja").write_text("{{ y }}")
    other = serving_config(settings, str(target), str(head), engine="vllm", engine_version="0.32.0")
    assert other["eagle3_aux_layer_ids"] == [0, 1, 2]
    assert other["chat_template_digest"] == "sha256:" + hashlib.sha256(b"{{ y }}").hexdigest()
    # no template, not an EAGLE-3 pair
    plain = serving_config({"method": "draft_model", "k": 4}, str(head), str(head),
                           engine="runner", engine_version="1")  # fmt: skip
    assert plain["chat_template_digest"] is None and plain["eagle3_aux_layer_ids"] is None
    # a head that declares no layers ran with the target's default (2, L/2, L-3): recorded
    (head / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 30}))
    default = serving_config(settings, str(target), str(head), engine="runner",
                             engine_version="1")  # fmt: skip
    assert default["eagle3_aux_layer_ids"] == [2, 15, 27]


def test_an_engine_that_does_not_answer_is_retried_not_failed() -> None:
    """Down or restarting is transient: not a PairregError, so the job loop retries the job;
    an engine that answers but cannot measure the pair fails it at once (EngineError)."""
    client = VllmClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(EngineUnavailable) as exc:
        client.card()
    assert not isinstance(exc.value, PairregError)
    assert client.version() is None
    assert issubclass(EngineError, PairregError)
