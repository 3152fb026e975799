"""The online monitor on a real engine's counters: the draft-model deployment served as
exported keeps the validated acceptance and is not flagged; the same deployment name served
by an engine whose speculative config was edited (n-gram lookup instead of the registered
draft) stays healthy (HTTP 200, the same greedy answers) while its acceptance drops, and
``pairreg telemetry scrape`` of vLLM's /metrics flags the drop against the validated
acceptance.

Two misconfigurations that do not show on the tiny pair, tried here: vLLM #50170's case (the
EAGLE-3 head served with auxiliary layers 0, 1, 2 instead of 1, 2, 3: vLLM logs and uses
them, and the tiny head accepts exactly as many drafts, 304 of 376 on these prompts, its
argmax hardly depending on the fused features), and target-v2 swapped in behind the draft
(greedy on code: 329 of 336 either way; the tiny drift shows when sampling). The swapped
target is caught from what the engine reports about itself instead: its /v1/models ``root``
names target-v2, and the scrape opens a ``serving`` flag (the last test)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from registry.db import session_scope
from registry.tables import Measurement, Pair
from runner import MeasureSettings, load_suite, measure_pair
from tests.engine.conftest import DEPLOYMENTS, FIGURES, EngineRegistry, Engines, K
from tests.requests.conftest import ACTOR

DEPLOYMENT = DEPLOYMENTS["draft_model"]
pytestmark = pytest.mark.engine(DEPLOYMENT, variant=1)
MAX_TOKENS = 32


def _prompts() -> list[Any]:
    return load_suite("code").prompts[:12]


def _traffic(url: str) -> tuple[int, int, list[str]]:
    """All prompts at once; returns the summed per-request (accepted, drafted) and texts."""

    def ask(p: Any) -> dict[str, Any]:
        r = httpx.post(f"{url}/v1/completions", timeout=600, json={
            "model": DEPLOYMENT, "prompt": p.prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
        })  # fmt: skip
        assert r.status_code == 200, r.text
        return dict(r.json())

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, _prompts()))
    specs = [a["metrics"]["speculative_decoding"] for a in answers]
    return (sum(s["num_accepted_draft_tokens"] for s in specs),
            sum(s["num_draft_tokens"] for s in specs),
            [a["choices"][0]["text"] for a in answers])  # fmt: skip


def _scrape(reg: EngineRegistry, url: str) -> dict[str, Any]:
    out = reg.cli("telemetry", "scrape", f"{url}/metrics", "--deployment", DEPLOYMENT,
                  "--min-drafted", "100", "--json").stdout  # fmt: skip
    return dict(json.loads(out))


def test_edited_speculative_config_flagged_from_vllm_counters(
    engines: Engines, engine_registry: EngineRegistry
) -> None:
    reg = engine_registry
    # the validated acceptance: the embedded runner on the same prompts, recorded as the
    # pair's measurement (the baseline the online monitor compares with)
    settings = MeasureSettings(method="draft_model", k=K, max_new_tokens=MAX_TOKENS, device="cpu")
    measured = measure_pair(str(reg.target_dir), reg.tiny.draft, _prompts(), settings,
                            plain_baseline=False)  # fmt: skip
    with session_scope(reg.db_url) as s:
        pair = s.scalar(select(Pair).where(Pair.pair_digest == reg.pairs["draft_model"]))
        assert pair is not None
        s.add(Measurement(
            pair_id=pair.id, suite_name="engine-telemetry", suite_digest="0" * 64,
            settings=measured.settings, settings_digest="0" * 64, runner_version="test",
            hardware=measured.hardware, alpha=measured.overall["alpha"],
            overall=measured.overall, categories=measured.categories, prompts=[], extra={},
            created_by=ACTOR,
        ))  # fmt: skip
    baseline = measured.overall["draft_acceptance_rate"]

    # served as exported: online acceptance near the validated one, no flag
    good = engines.serve(DEPLOYMENT)
    _scrape(reg, good.url)
    good_acc, good_drafted, good_texts = _traffic(good.url)
    ok = _scrape(reg, good.url)
    assert ok["deltas"]["num_accepted_tokens"] == good_acc  # the scrape saw exactly our traffic
    assert ok["deltas"]["num_draft_tokens"] == good_drafted
    assert ok["baseline_acceptance"] == pytest.approx(baseline)
    assert ok["pair_digest"] == reg.pairs["draft_model"]
    assert not ok["flagged"], ok
    # what the engine reports about itself is the live pair as exported: no serving flag
    assert ok["serving"]["differences"] == [] and not ok["serving"]["flagged"], ok["serving"]
    assert ok["serving"]["reported"]["root"] == str(reg.target_dir)
    assert ok["serving"]["reported"]["served_model"] == DEPLOYMENT

    # the export's arguments with the speculative config edited behind the same served
    # name: n-gram lookup instead of the registered draft model
    export = reg.export_vllm(DEPLOYMENT)
    args = list(export["args"])
    i = args.index("--speculative-config") + 1
    args[i] = json.dumps({"method": "ngram", "num_speculative_tokens": K,
                          "prompt_lookup_max": 4, "prompt_lookup_min": 2})  # fmt: skip
    bad = engines.serve(DEPLOYMENT, args=args, variant="ngram-swapped-in")
    served = httpx.get(f"{bad.url}/v1/models", timeout=30).json()["data"][0]
    assert served["id"] == DEPLOYMENT  # nothing in the served name tells them apart
    first = _scrape(reg, bad.url)
    assert first["reset"]  # a new engine process: counters started again
    bad_acc, bad_drafted, bad_texts = _traffic(bad.url)
    assert bad_texts == good_texts  # lossless: the same answers, only slower
    flagged = _scrape(reg, bad.url)
    FIGURES["online_monitor"] = {
        "validated_rate": round(baseline, 4),
        "as_exported": {"accepted": good_acc, "drafted": good_drafted,
                        "online": round(ok["online_acceptance"], 4)},
        "ngram_swapped_in": {"accepted": bad_acc, "drafted": bad_drafted,
                                 "window_online": round(flagged["online_acceptance"], 4)},
        "margin": flagged["margin"],
    }  # fmt: skip
    assert bad_acc / bad_drafted < good_acc / good_drafted, FIGURES["online_monitor"]
    assert flagged["window_drafted"] == good_drafted + bad_drafted
    assert flagged["flagged"] and flagged["flag_id"], FIGURES["online_monitor"]
    # vLLM reports nothing of its speculative config over HTTP: the swap shows only here
    assert flagged["serving"]["differences"] == [], flagged["serving"]


@pytest.mark.engine(DEPLOYMENT, variant=2)
def test_target_swapped_in_behind_the_deployment_opens_a_serving_flag(
    engines: Engines, engine_registry: EngineRegistry
) -> None:
    """target-v2 served under the deployment's name with the live pair's draft, without
    being promoted: the scrape reads the engine's /v1/models and flags the target."""
    reg = engine_registry
    args = list(reg.export_vllm(DEPLOYMENT)["args"])
    args[args.index("--model") + 1] = reg.tiny.target_v2
    swapped = engines.serve(DEPLOYMENT, args=args, variant="target-v2-swapped-in")
    out = _scrape(reg, swapped.url)
    check = out["serving"]
    FIGURES["serving_flag"] = {"differences": check["differences"],
                               "reported": check["reported"]}  # fmt: skip
    assert check["flagged"] and check["flag_id"], check
    assert check["differences"] == [
        {"field": "root", "expected": str(reg.target_dir), "reported": reg.tiny.target_v2}
    ], check
    assert check["reported"]["served_model"] == DEPLOYMENT  # the same name: only root differs
    flags = json.loads(reg.cli("drift", "list", "--kind", "serving", "--json").stdout)
    items = flags["items"] if isinstance(flags, dict) else flags
    (flag,) = [f for f in items if f["id"] == check["flag_id"]]
    assert flag["pair_digest"] == reg.pairs["draft_model"] and flag["state"] == "open"
    assert flag["effects"]["differences"] == check["differences"]
