"""The real SmolLM2 pair in a real vLLM: its exports load, and the α the engine delivers is
the α the runner measures.

Real target-v1 (SmolLM2-135M-Instruct: a real tokenizer, a real chat template, ``<|im_end|>``
as end of turn) with its distilled draft (``draft_model``) and with its EAGLE-3 head in the
speculators format (``eagle3``, as ``pairreg export speculators`` writes it), registered
beside the tiny pairs and served from ``pairreg export vllm``'s own arguments, one server per
method, and the target alone under prompt lookup (vLLM ``ngram``). Fidelity as in
``test_fidelity.py``, on the chat suites rendered with the target's
own template: (a) vLLM's greedy tokens equal the runner's for every prompt; (b) counted as
vLLM counts (``full_last_draft``), each request's counters equal vLLM's and each category's
rate lies in the runner's 95 % interval. Under prompt lookup the greedy tokens are compared.

The real pair's cache is built by the real-pair tier (``pairreg real build --heads``), which
CI runs before this one; locally the fixture builds it or reuses it. Prompt counts and the
token budget are small: the runner decodes a 135M model on two cores.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry.db import session_scope
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from runner import MeasureSettings, load_suite, measure_pair
from runner.models import load_tokenizer
from runner.render import encode_prompt
from tests.conftest import TEST_CACHE
from tests.engine.conftest import FIGURES, EngineRegistry, Engines, K
from tests.requests.conftest import ACTOR, promote_at

REAL_DEPLOYMENTS = {
    "draft_model": "real-draft",
    "eagle3": "real-eagle3",
    "prompt_lookup": "real-ngram",
}
CATEGORIES = ("chat:code", "chat:creative")
PER_CATEGORY = 4
MAX_TOKENS = 24
# the name the heads' speculators config gives their verifier (builders.real_heads)
TARGET_NAME = "real/target-v1"


@dataclass
class RealDeployments:
    """The real parts' directories and the pairs registered from them (method -> digest)."""

    target: str
    draft: str
    eagle3: str
    pairs: dict[str, str]


@pytest.fixture(scope="module")
def real_registry(engine_registry: EngineRegistry) -> RealDeployments:
    """Real target-v1, its draft and its EAGLE-3 head registered in the engine tier's
    registry, with the target alone under prompt lookup; ``real-draft``, ``real-eagle3`` and
    ``real-ngram`` live."""
    from datetime import UTC, datetime, timedelta

    from builders.real import build_real_pair, default_real_dir
    from builders.real_heads import build_real_heads

    real = build_real_pair(default_real_dir(TEST_CACHE))
    heads = build_real_heads(real.root)
    reg = engine_registry
    pairs: dict[str, str] = {}
    with session_scope(reg.db_url) as s:
        t = art_svc.add_artifact(s, source=real.target_v1, name=TARGET_NAME, role="target",
                                 actor=ACTOR).artifact  # fmt: skip
        d = art_svc.add_artifact(s, source=real.draft, name="real/draft", role="draft",
                                 actor=ACTOR).artifact  # fmt: skip
        h = art_svc.add_artifact(s, source=heads.eagle3, name="real/eagle3", role="heads",
                                 actor=ACTOR).artifact  # fmt: skip
        for method, drafter in (("draft_model", d.ref), ("eagle3", h.ref),
                                ("prompt_lookup", None)):  # fmt: skip
            registered = pair_svc.register_pair(
                s, target=t.ref, draft=drafter, method=method, k=K, actor=ACTOR
            )
            assert registered.pair.warnings == [], registered.pair.warnings
            pairs[method] = registered.pair.pair_digest
    live_from = datetime.now(UTC) - timedelta(minutes=5)
    for method, digest in pairs.items():
        promote_at(reg.db_url, REAL_DEPLOYMENTS[method], digest, live_from)
    return RealDeployments(real.target_v1, real.draft, heads.eagle3, pairs)


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The runner decodes the 135M model on every core (the session's default is one
    thread, right for the tiny models); vLLM is idle while it does."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    yield
    torch.set_num_threads(before)


def _spec(args: list[str]) -> tuple[int, dict[str, Any]]:
    i = args.index("--speculative-config") + 1
    return i, json.loads(args[i])


def _models(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]


def _chat(url: str, model: str, prompt: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [dict(m) for m in prompt.messages],
            "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}  # fmt: skip
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _prompts() -> list[Any]:
    out = []
    for name in CATEGORIES:
        out += [replace(p, category=name) for p in load_suite(name).prompts[:PER_CATEGORY]]
    return out


def _fidelity(engines: Engines, real: RealDeployments, method: str, drafter: str) -> None:
    deployment = REAL_DEPLOYMENTS[method]
    server = engines.serve(deployment)
    assert _models(server.url) == [deployment]
    prompts = _prompts()
    with ThreadPoolExecutor(len(prompts)) as pool:  # all in flight at once, as served
        answers = list(pool.map(lambda p: _chat(server.url, deployment, p), prompts))
    settings = MeasureSettings(method=method, k=K, max_new_tokens=MAX_TOKENS, device="cpu",
                               full_last_draft=True)  # fmt: skip
    full = measure_pair(real.target, drafter, prompts, settings, plain_baseline=False)
    tokenizer = load_tokenizer(real.target)
    eos = {int(tokenizer.eos_token_id)}
    rows, same_tokens, same_counters, ended = [], 0, 0, 0
    mismatches: list[dict[str, Any]] = []
    for p, answer, f_row in zip(prompts, answers, full.prompts, strict=True):
        choice = answer["choices"][0]
        # the same rendering: the template's own BOS-less <|im_start|> turns, nothing added
        assert answer["usage"]["prompt_tokens"] == len(encode_prompt(tokenizer, p)), p.id
        engine_ids = [i for i in choice["token_ids"] if i not in eos]
        runner_ids = [i for i in f_row["output_ids"] if i not in eos]
        ended += choice["finish_reason"] == "stop"
        spec = answer["metrics"]["speculative_decoding"]
        assert spec["num_spec_tokens"] == K
        row = {"category": p.category, "drafted": spec["num_draft_tokens"],
               "accepted": spec["num_accepted_draft_tokens"],
               "steps": spec["num_spec_steps"]}  # fmt: skip
        rows.append(row)
        same_tokens += engine_ids == runner_ids
        same = (row["drafted"], row["accepted"], row["steps"]) == (
            f_row["drafted"], f_row["accepted"], f_row["steps"])  # fmt: skip
        same_counters += same
        if engine_ids != runner_ids or not same:
            mismatches.append({"prompt": p.id, "vllm": row, "runner": {
                k: f_row[k] for k in ("drafted", "accepted", "steps")},
                "vllm_ids": engine_ids, "runner_ids": runner_ids})  # fmt: skip
    table = {}
    for category in CATEGORIES:
        mine = [r for r in rows if r["category"] == category]
        acc, drafted = sum(r["accepted"] for r in mine), sum(r["drafted"] for r in mine)
        cat = full.categories[category]
        table[category] = {
            "prompts": len(mine),
            "vllm": round(acc / max(1, drafted), 4),
            "vllm_counters": [acc, drafted],
            "runner_full": round(cat["draft_acceptance_rate"], 4),
            "runner_full_ci": [round(x, 4) for x in cat["draft_acceptance_rate_ci"]],
            "runner_full_counters": [cat["counters"]["accepted"], cat["counters"]["drafted"]],
        }
    FIGURES.setdefault("fidelity", {})[f"real:{method}"] = {
        "tokens_equal": f"{same_tokens}/{len(prompts)}",
        "per_request_counters_equal": f"{same_counters}/{len(prompts)}",
        "ended_by_end_of_turn": f"{ended}/{len(prompts)}",
        "max_tokens": MAX_TOKENS,
        "categories": table,
        "mismatches": mismatches,
    }
    report = FIGURES["fidelity"][f"real:{method}"]
    # (a) greedy: vLLM's tokens are the runner's, prompt by prompt
    assert same_tokens == len(prompts), report
    # counted alike, each request's counters are the engine's exactly
    assert same_counters == len(prompts), report
    for category, row in table.items():
        # (b) the engine's rate within the runner's 95 % interval, counted alike
        lo, hi = row["runner_full_ci"]
        assert lo - 1e-9 <= row["vllm"] <= hi + 1e-9, (category, row)
        assert row["vllm_counters"][1] > 0  # the engine speculated on every category


@pytest.mark.engine(REAL_DEPLOYMENTS["draft_model"])
def test_real_draft_model_export_serves_and_matches_the_runner(
    engines: Engines,
    engine_registry: EngineRegistry,
    real_registry: RealDeployments,
    two_threads: None,
) -> None:
    """The real draft-model export, run as printed: the registered directories, float32,
    the pair's k; then fidelity on the chat suites."""
    export = engine_registry.export_vllm(REAL_DEPLOYMENTS["draft_model"])
    args = export["args"]
    assert export["pair_digest"] == real_registry.pairs["draft_model"]
    assert args[args.index("--model") + 1] == real_registry.target
    assert args[args.index("--dtype") + 1] == "float32"
    assert _spec(args)[1] == {"method": "draft_model", "model": real_registry.draft,
                              "num_speculative_tokens": K}  # fmt: skip
    _fidelity(engines, real_registry, "draft_model", real_registry.draft)


@pytest.mark.engine(REAL_DEPLOYMENTS["eagle3"])
def test_real_eagle3_speculators_export_serves_and_matches_the_runner(
    engines: Engines,
    engine_registry: EngineRegistry,
    real_registry: RealDeployments,
    two_threads: None,
    tmp_path: Path,
) -> None:
    """``pairreg export speculators`` of the real EAGLE-3 pair (verifier pinned, the
    auxiliary layers 2, 15, 27 kept) loads in vLLM with the deployment's export (the head's
    directory the only argument changed); then fidelity with the head served from it."""
    reg = engine_registry
    out = tmp_path / "real-eagle3-speculators"
    reg.cli("export", "speculators", real_registry.pairs["eagle3"], str(out))
    config = json.loads((out / "config.json").read_text())
    assert config["pairreg"]["pair_digest"] == real_registry.pairs["eagle3"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    export = reg.export_vllm(REAL_DEPLOYMENTS["eagle3"])
    args = list(export["args"])
    assert args[args.index("--model") + 1] == real_registry.target
    i, spec = _spec(args)
    assert spec == {"method": "eagle3", "model": real_registry.eagle3,
                    "num_speculative_tokens": K}  # fmt: skip
    args[i] = json.dumps({**spec, "model": str(out)})
    engines.stop()
    engines.serve(REAL_DEPLOYMENTS["eagle3"], args=args)
    _fidelity(engines, real_registry, "eagle3", real_registry.eagle3)


@pytest.mark.engine(REAL_DEPLOYMENTS["prompt_lookup"])
def test_real_ngram_export_serves_the_runners_greedy_tokens(
    engines: Engines,
    engine_registry: EngineRegistry,
    real_registry: RealDeployments,
    two_threads: None,
) -> None:
    """The real target under prompt lookup, served from its export (vLLM ``ngram``, the
    pair's n-gram window and k): vLLM speculates from the prompt's own n-grams, and its greedy
    tokens are the runner's for every chat prompt. The two n-gram searches may pick different
    earlier matches, so only the tokens (which lossless speculation must not change) and the
    engine's own counters are compared, not acceptance."""
    deployment = REAL_DEPLOYMENTS["prompt_lookup"]
    export = engine_registry.export_vllm(deployment)
    args = export["args"]
    assert export["pair_digest"] == real_registry.pairs["prompt_lookup"]
    assert args[args.index("--model") + 1] == real_registry.target
    spec = _spec(args)[1]
    assert spec["method"] == "ngram" and "model" not in spec, spec
    assert spec["num_speculative_tokens"] == K
    assert spec["prompt_lookup_min"] <= spec["prompt_lookup_max"], spec
    server = engines.serve(deployment)
    assert _models(server.url) == [deployment]
    prompts = _prompts()
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: _chat(server.url, deployment, p), prompts))
    settings = MeasureSettings(method="prompt_lookup", k=K, max_new_tokens=MAX_TOKENS,
                               device="cpu")  # fmt: skip
    runner = measure_pair(real_registry.target, None, prompts, settings, plain_baseline=False)
    eos = {int(load_tokenizer(real_registry.target).eos_token_id)}
    drafted = 0
    for p, answer, row in zip(prompts, answers, runner.prompts, strict=True):
        choice = answer["choices"][0]
        engine_ids = [i for i in choice["token_ids"] if i not in eos]
        runner_ids = [i for i in row["output_ids"] if i not in eos]
        assert engine_ids == runner_ids, (p.id, engine_ids, runner_ids)
        spec_metrics = answer["metrics"]["speculative_decoding"]
        assert spec_metrics["num_spec_tokens"] == K
        assert spec_metrics["num_accepted_draft_tokens"] <= spec_metrics["num_draft_tokens"]
        drafted += spec_metrics["num_draft_tokens"]
    FIGURES.setdefault("fidelity", {})["real:prompt_lookup"] = {
        "tokens_equal": f"{len(prompts)}/{len(prompts)}", "vllm_drafted": drafted}  # fmt: skip
    assert drafted > 0  # the chat answers repeat their prompts' n-grams: vLLM proposed some
