"""The official openai client → ``pairreg proxy`` → a real vLLM serving the draft-model
export: every request (completions and chat, plain and streamed) is tagged with the exact
pair digest and vLLM's own per-request counters, the counters summed over the tags equal the
deltas of vLLM's Prometheus counters over the same requests, and ``pairreg audit request``
reconstructs a vLLM-served request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry.services.telemetry import parse_vllm_metrics
from runner import load_suite
from tests.engine.conftest import DEPLOYMENTS, FIGURES, EngineRegistry, Engines, K
from tests.engine.vllm_server import REPO
from tests.serve_process import ApiServer, free_port, mint

pytestmark = pytest.mark.engine(DEPLOYMENTS["draft_model"])
DEPLOYMENT = DEPLOYMENTS["draft_model"]


def _start_proxy(reg: EngineRegistry, upstream: str, registry_url: str, token: str,
                 log: Path) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
    port = free_port()
    env = {**reg.env, "PAIRREG_URL": registry_url, "PAIRREG_TOKEN": token}
    env.pop("PAIRREG_DATABASE_URL", None)
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "proxy", "--deployment", DEPLOYMENT,
         "--upstream", upstream, "--port", str(port), "--spool", str(log.parent / "spool"),
         "--refresh", "60", "--log-level", "warning"],
        cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            health = httpx.get(f"{url}/healthz", timeout=1).json()
            if health.get("pair_digest"):
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"proxy did not come up with the live pair: {log.read_text()[-2000:]}")


def _wait_tags(ops: httpx.Client, ids: list[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        tags = {}
        for rid in ids:
            r = ops.get(f"/v1/requests/{rid}")
            if r.status_code == 200:
                tags[rid] = r.json()["tag"]
        if len(tags) == len(ids) or time.monotonic() > deadline:
            return tags
        time.sleep(0.3)


def test_openai_client_through_proxy_to_vllm_reconciles(
    engines: Engines, engine_registry: EngineRegistry, tmp_path: Path
) -> None:
    from openai import OpenAI

    reg = engine_registry
    digest = reg.pairs["draft_model"]
    vllm = engines.serve(DEPLOYMENT)
    admin = mint(reg.db_url, role="admin", name="proxy-ops")
    server = ApiServer(reg.db_url, tmp_path / "api-home").start()
    proxy = None
    try:
        # the proxy reads the live pair (READ_REGISTRY) and ships tags (INGEST): one token
        # holding both is an admin's
        proxy, proxy_url = _start_proxy(reg, vllm.url, server.url, admin, tmp_path / "proxy.log")
        client = OpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)
        before = parse_vllm_metrics(vllm.metrics())
        # prompts whose drafts are partly rejected, so every counter and position matters
        text_prompt = load_suite("creative").prompts[0].prompt
        chat = [dict(m) for m in load_suite("chat:code").prompts[0].messages or ()]
        answers: dict[str, dict[str, Any]] = {}

        raw = client.completions.with_raw_response.create(
            model=DEPLOYMENT, prompt=text_prompt, max_tokens=32, temperature=0,
            extra_headers={"x-request-id": "eng-cmpl"},
        )  # fmt: skip
        assert raw.headers["x-pairreg-pair-digest"] == digest
        plain = raw.parse()
        answers["eng-cmpl"] = plain.model_extra["metrics"]["speculative_decoding"]
        stream = client.completions.create(
            model=DEPLOYMENT, prompt=text_prompt, max_tokens=32, temperature=0,
            stream=True, extra_headers={"x-request-id": "eng-cmpl-stream"},
        )  # fmt: skip
        chunks = list(stream)
        assert all(c.choices for c in chunks)  # the usage event the proxy asked for is hidden
        assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
        raw_chat = client.chat.completions.with_raw_response.create(
            model=DEPLOYMENT, messages=chat, max_tokens=32, temperature=0,
            extra_headers={"x-request-id": "eng-chat"},
        )  # fmt: skip
        assert raw_chat.headers["x-pairreg-pair-digest"] == digest
        chat_plain = raw_chat.parse()
        answers["eng-chat"] = chat_plain.model_extra["metrics"]["speculative_decoding"]
        chat_stream = client.chat.completions.create(
            model=DEPLOYMENT, messages=chat, max_tokens=32, temperature=0, stream=True,
            extra_headers={"x-request-id": "eng-chat-stream"},
        )  # fmt: skip
        text = "".join((c.choices[0].delta.content or "") for c in chat_stream if c.choices)
        assert text == chat_plain.choices[0].message.content
        after = parse_vllm_metrics(vllm.metrics())

        ops = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"})
        ids = ["eng-cmpl", "eng-cmpl-stream", "eng-chat", "eng-chat-stream"]
        tags = _wait_tags(ops, ids)
        assert sorted(tags) == sorted(ids), tags
        for rid, tag in tags.items():
            assert tag["pair_digest"] == digest and tag["consistent"], (rid, tag)
            assert tag["spec"] and tag["spec"]["num_draft_tokens"] > 0, (rid, tag)
            assert tag["output_tokens"] == 32 or tag["output_tokens"] > 0
        for rid, spec in answers.items():  # the tag holds what vLLM answered
            assert tags[rid]["spec"]["num_draft_tokens"] == spec["num_draft_tokens"]
            assert (
                tags[rid]["spec"]["num_accepted_draft_tokens"] == spec["num_accepted_draft_tokens"]
            )
            assert tags[rid]["spec"]["acceptance_histogram"] == spec["acceptance_histogram"]
        # greedy: the streamed twin of each request drafted and accepted the same
        assert tags["eng-cmpl-stream"]["spec"] == tags["eng-cmpl"]["spec"]
        assert tags["eng-chat-stream"]["spec"] == tags["eng-chat"]["spec"]

        sums = {
            key: sum(t["spec"][key] for t in tags.values())
            for key in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
        }
        delta = {key: after[key] - before[key] for key in
                 ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}  # fmt: skip
        FIGURES["reconciliation"] = {
            "requests": {rid: {k: tags[rid]["spec"][k] for k in sums} for rid in ids},
            "sum_over_tags": sums,
            "prometheus_delta": delta,
        }
        assert sums["num_spec_steps"] == delta["num_drafts"]
        assert sums["num_draft_tokens"] == delta["num_draft_tokens"] == K * delta["num_drafts"]
        assert sums["num_accepted_draft_tokens"] == delta["num_accepted_tokens"]
        assert sums["num_accepted_draft_tokens"] < sums["num_draft_tokens"]  # not all accepted
        per_pos = [after["accepted_per_pos"][str(i)] - before["accepted_per_pos"].get(str(i), 0)
                   for i in range(K)]  # fmt: skip
        hist_pos = [sum(sum(t["spec"]["acceptance_histogram"][j + 1:]) for t in tags.values())
                    for j in range(K)]  # fmt: skip
        assert per_pos == hist_pos  # accepted at position i = steps that accepted more than i

        audit = json.loads(reg.cli("audit", "request", "eng-chat", "--json").stdout)
        FIGURES["audit_request_keys"] = sorted(audit)
        flat = json.dumps(audit)
        assert digest in flat
        assert audit["tag"]["spec"] == tags["eng-chat"]["spec"]
        assert str(reg.target_dir) in flat  # the target's files, as registered
    finally:
        if proxy is not None and proxy.poll() is None:
            os.killpg(proxy.pid, 15)
            proxy.wait(15)
        server.stop()
