"""vLLM accepts the draft length per batch size that ``pairreg export vllm DEPLOYMENT
--hardware PROFILE`` puts in its speculative config (``num_speculative_tokens_per_batch_size``),
served through the OpenAI server from the export's own arguments, and completes a request
speculating with the k the schedule gives batch size 1."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import select

from registry.db import session_scope
from registry.services import measurements
from registry.tables import Pair
from runner import MeasureSettings, load_suite, measure_pair
from tests.engine.conftest import DEPLOYMENTS, FIGURES, EngineRegistry, Engines, K
from tests.requests.conftest import ACTOR

DEPLOYMENT = DEPLOYMENTS["draft_model"]
pytestmark = pytest.mark.engine(DEPLOYMENT, variant=2)
MAX_BATCH = 512


def test_vllm_serves_the_exported_k_schedule(
    engines: Engines, engine_registry: EngineRegistry
) -> None:
    reg = engine_registry
    # the schedule is built from the pair's latest measurement: a real one, by the runner
    prompts = load_suite("code").prompts[:4]
    settings = MeasureSettings(method="draft_model", k=K, max_new_tokens=24, device="cpu")
    measured = measure_pair(str(reg.target_dir), reg.tiny.draft, prompts, settings,
                            plain_baseline=False)  # fmt: skip
    with session_scope(reg.db_url) as s:
        pair = s.scalar(select(Pair).where(Pair.pair_digest == reg.pairs["draft_model"]))
        assert pair is not None
        measurements.store_measurement(
            s, pair=pair.pair_digest, suite_name="engine-k-schedule", suite_digest="k" * 64,
            settings=measured.settings, runner_version="engine-test",
            result=measured.to_dict(), actor=ACTOR,
        )  # fmt: skip

    out = reg.cli("export", "vllm", DEPLOYMENT, "--hardware", "a100-80gb", "--context", "512",
                  "--max-batch", str(MAX_BATCH), "--json").stdout  # fmt: skip
    export = json.loads(out)
    args = list(export["args"])
    spec = json.loads(args[args.index("--speculative-config") + 1])
    schedule = spec["num_speculative_tokens_per_batch_size"]
    assert (
        spec["num_speculative_tokens"] == K and schedule[0][0] == 1 and schedule[-1][1] == MAX_BATCH
    )
    assert all(0 <= k <= K for *_, k in schedule)
    k_at_1 = schedule[0][2]

    server = engines.serve(DEPLOYMENT, args=args, variant="k-schedule")
    resp = httpx.post(f"{server.url}/v1/completions", timeout=300, json={
        "model": DEPLOYMENT, "prompt": prompts[0].prompt, "max_tokens": 24, "temperature": 0,
    })  # fmt: skip
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["completion_tokens"] == 24
    spec_counts = (body.get("metrics") or {}).get("speculative_decoding") or {}
    drafted = int(spec_counts.get("num_draft_tokens") or 0)
    steps = int(spec_counts.get("num_spec_steps") or 0)
    # one request is batch size 1: vLLM drafts the schedule's k there (none when it is 0)
    assert (drafted > 0) == (k_at_1 > 0), (schedule, spec_counts)
    if k_at_1:
        assert drafted == steps * k_at_1, (schedule, spec_counts)
    FIGURES["k_schedule"] = {"schedule": schedule, "batch_1": spec_counts}
