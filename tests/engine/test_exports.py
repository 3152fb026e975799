"""The engine is the judge of an export: each method's ``pairreg export`` output, run as
printed, loads in a real vLLM, serves the deployment's name and speculates (its own
counters move). A refused or misread export fails here."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import httpx
import pytest

from registry.services.telemetry import parse_vllm_metrics
from tests.engine.conftest import DEPLOYMENTS, EngineRegistry, Engines, K

pytestmark = pytest.mark.engine


def _complete(url: str, model: str, prompt: str, max_tokens: int = 24) -> dict:
    resp = httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=300,
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def _check_serves(engines: Engines, deployment: str, prompt: str) -> dict:
    server = engines.serve(deployment)
    models = httpx.get(f"{server.url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == [deployment]
    before = parse_vllm_metrics(server.metrics())
    body = _complete(server.url, deployment, prompt)
    after = parse_vllm_metrics(server.metrics())
    assert body["system_fingerprint"].startswith("vllm-")
    spec = body["metrics"]["speculative_decoding"]
    assert spec["num_spec_tokens"] == K  # the export's k is the k vLLM runs
    assert spec["num_spec_steps"] >= 1 and spec["num_draft_tokens"] > 0
    assert after["num_draft_tokens"] - before["num_draft_tokens"] == spec["num_draft_tokens"]
    return body


def test_export_of_local_files_names_the_verified_directories(
    engine_registry: EngineRegistry,
) -> None:
    """A pair of local files exports its registered directories (checked against their
    manifests), no revision flags; a changed file refuses the export, naming it."""
    export = engine_registry.export_vllm(DEPLOYMENTS["draft_model"])
    args = export["args"]
    assert export["command"].startswith("python -m vllm.entrypoints.openai.api_server ")
    assert shlex.split(export["command"])[3:] == args
    assert args[args.index("--model") + 1] == str(engine_registry.target_dir)
    assert "--revision" not in args and "--tokenizer-revision" not in args
    assert args[args.index("--dtype") + 1] == "float32"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": engine_registry.tiny.draft,
                    "num_speculative_tokens": K}  # fmt: skip
    assert export["pair_digest"] == engine_registry.pairs["draft_model"]

    gen = Path(engine_registry.target_dir) / "generation_config.json"
    original = gen.read_bytes()
    try:
        gen.write_bytes(original + b" ")
        refused = engine_registry.cli("export", "vllm", DEPLOYMENTS["draft_model"], check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "generation_config.json" in refused.stderr + refused.stdout
        assert "Traceback" not in refused.stderr
    finally:
        gen.write_bytes(original)


@pytest.mark.engine(DEPLOYMENTS["draft_model"])
def test_draft_model_export_serves(engines: Engines) -> None:
    _check_serves(engines, DEPLOYMENTS["draft_model"], "def add(a, b):")


@pytest.mark.engine(DEPLOYMENTS["prompt_lookup"])
def test_ngram_export_serves(engines: Engines, engine_registry: EngineRegistry) -> None:
    export = engine_registry.export_vllm(DEPLOYMENTS["prompt_lookup"])
    spec = json.loads(export["args"][export["args"].index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and "model" not in spec
    # a prompt that repeats itself, so the n-gram drafter finds matches to propose
    prompt = "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny = 2\nx = 1\n"
    _check_serves(engines, DEPLOYMENTS["prompt_lookup"], prompt)


@pytest.mark.engine(DEPLOYMENTS["eagle3"])
def test_eagle3_speculators_export_serves(
    engines: Engines, engine_registry: EngineRegistry, tmp_path: Path
) -> None:
    """``pairreg export speculators`` writes the head with its verifier pinned; vLLM serves
    the EAGLE-3 deployment's export with the head taken from that directory (the only
    argument changed), so the keys pairreg adds do not stop vLLM from reading it."""
    reg = engine_registry
    out = tmp_path / "eagle3-speculators"
    reg.cli("export", "speculators", reg.pairs["eagle3"], str(out))
    config = json.loads((out / "config.json").read_text())
    assert config["pairreg"]["pair_digest"] == reg.pairs["eagle3"]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    export = reg.export_vllm(DEPLOYMENTS["eagle3"])
    args = list(export["args"])
    i = args.index("--speculative-config") + 1
    spec = json.loads(args[i])
    assert spec == {"method": "eagle3", "model": reg.tiny.eagle3, "num_speculative_tokens": K}
    args[i] = json.dumps({**spec, "model": str(out)})
    engines.stop()
    engines.serve(DEPLOYMENTS["eagle3"], args=args)
    _check_serves(engines, DEPLOYMENTS["eagle3"], "def add(a, b):")
