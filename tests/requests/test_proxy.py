"""The proxy, called with the official openai client, in front of the embedded
/v1/completions server (which tags for itself) and of a vLLM stand-in (which does not):
plain and streamed requests are tagged once, with the live pair and vLLM-style counters."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from api.client import PairregClient
from api.proxy import create_proxy_app
from api.tagger import Tagger
from registry.db import session_scope
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from registry.settings import Settings
from tests.requests.conftest import ACTOR, promote_at
from tests.serve_process import ApiServer, free_port, mint

pytestmark = pytest.mark.slow


class _Thread(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # run in a thread
        pass


def test_openai_client_through_proxy(tiny, sqlite_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime, timedelta

    from openai import OpenAI

    with session_scope(sqlite_url) as s:
        t = art_svc.add_artifact(s, source=tiny.target_v1, name="tiny/target", role="target",
                                 actor=ACTOR).artifact  # fmt: skip
        d = art_svc.add_artifact(s, source=tiny.draft, name="tiny/draft", role="draft",
                                 actor=ACTOR).artifact  # fmt: skip
        pair = pair_svc.register_pair(s, target=t.ref, draft=d.ref, method="draft_model", k=3,
                                      actor=ACTOR).pair  # fmt: skip
    promote_at(sqlite_url, "tiny-prod", pair.pair_digest, datetime.now(UTC) - timedelta(seconds=5))
    token = mint(sqlite_url, role="ingest", name="serving")
    admin = mint(sqlite_url, role="admin", name="ops")
    server = ApiServer(sqlite_url, tmp_path / "home").start()
    tagger = Tagger(server.url, token, tmp_path / "spool", flush_interval=0.05)
    backend = PairregClient(server.url, token=admin)
    app = create_proxy_app(deployment="tiny-prod", upstream=server.url, settings=Settings(),
                           spool_dir=tmp_path / "spool", backend=backend, tagger=tagger,
                           refresh_s=60)  # fmt: skip
    port = free_port()
    proxy = _Thread(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=proxy.run, daemon=True)
    thread.start()
    try:
        while not proxy.started:
            time.sleep(0.05)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0)
        raw = client.completions.with_raw_response.create(
            model="tiny-prod", prompt="def add(a, b):", max_tokens=12,
            extra_headers={"x-request-id": "oa-plain"},
        )  # fmt: skip
        assert raw.headers["x-request-id"] == "oa-plain"
        assert raw.headers["x-pairreg-pair-digest"] == pair.pair_digest
        plain = raw.parse()
        assert plain.choices[0].text and plain.usage.completion_tokens > 0

        raw_stream = client.completions.with_raw_response.create(
            model="tiny-prod", prompt="def add(a, b):", max_tokens=12, stream=True
        )
        stream_id = raw_stream.headers["x-request-id"]
        chunks = list(raw_stream.parse())
        assert all(c.choices for c in chunks)  # the usage event the proxy asked for is hidden
        streamed = "".join(c.choices[0].text for c in chunks)
        assert streamed == plain.choices[0].text  # greedy: the same answer either way

        assert tagger.flush(60)
        ops = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"})
        got = ops.get("/v1/requests/oa-plain").json()
        tag = got["tag"]
        assert tag["pair_digest"] == pair.pair_digest and tag["consistent"]
        assert tag["output_tokens"] == plain.usage.completion_tokens
        assert tag["input_tokens"] == plain.usage.prompt_tokens
        spec = tag["spec"]
        metrics = plain.model_extra["metrics"]["speculative_decoding"]
        assert spec["num_draft_tokens"] == metrics["num_draft_tokens"] > 0
        assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
        s_tag = ops.get(f"/v1/requests/{stream_id}").json()["tag"]
        assert s_tag["output_tokens"] == tag["output_tokens"]
        assert s_tag["spec"] == spec
        page = ops.get("/v1/requests", params={"deployment": "tiny-prod"}).json()
        assert page["counts"]["total"] == 2  # tagged once each, by the server itself
        assert tagger.stats["tagged"] == 0  # the proxy saw the server's header and stood back

        direct = httpx.post(
            f"{server.url}/v1/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"model": "tiny-prod", "prompt": "x = ", "max_tokens": 4},
        )
        assert direct.status_code == 200, direct.text
        rid = direct.headers["x-request-id"]
        assert ops.get(f"/v1/requests/{rid}").json()["tag"]["pair_filled"] is False
        assert json.loads(direct.text)["metrics"]["speculative_decoding"]["num_spec_steps"] >= 1
    finally:
        proxy.should_exit = True
        thread.join(10)
        tagger.close(5)
        server.stop()


def _fake_vllm() -> FastAPI:
    """Stands in for vLLM (which cannot run here): OpenAI-shaped completions carrying vLLM's
    per-request ``metrics.speculative_decoding`` counters, and no pairreg headers."""
    fake = FastAPI()
    spec = {"num_spec_steps": 4, "num_draft_tokens": 12, "num_accepted_draft_tokens": 7,
            "acceptance_histogram": [1, 1, 2, 0]}  # fmt: skip
    usage = {"prompt_tokens": 5, "completion_tokens": 11, "total_tokens": 16}

    @fake.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        choice = {"index": 0, "text": "hello world", "finish_reason": "stop"}
        if not body.get("stream"):
            return {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                    "choices": [choice], "usage": usage,
                    "metrics": {"speculative_decoding": spec}}  # fmt: skip

        def events():  # type: ignore[no-untyped-def]
            for word in ("hello", " world"):
                part = {"index": 0, "text": word, "finish_reason": None}
                chunk = {"id": "cmpl-2", "object": "text_completion", "model": body["model"],
                         "choices": [part]}  # fmt: skip
                yield f"data: {json.dumps(chunk)}\n\n"
            tail = {"id": "cmpl-2", "object": "text_completion", "model": body["model"],
                    "choices": [], "usage": usage,
                    "metrics": {"speculative_decoding": spec}}  # fmt: skip
            yield f"data: {json.dumps(tail)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return fake


def test_proxy_tags_requests_a_plain_upstream_served(sqlite_url: str, tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from fastapi.testclient import TestClient

    from tests.fixtures import write_fake_model

    with session_scope(sqlite_url) as s:
        t = art_svc.add_artifact(s, source=str(write_fake_model(tmp_path / "t")), name="a/t",
                                 role="target", actor=ACTOR).artifact  # fmt: skip
        pair = pair_svc.register_pair(s, target=t.ref, method="prompt_lookup", k=4,
                                      actor=ACTOR).pair  # fmt: skip
    promote_at(sqlite_url, "vllm-prod", pair.pair_digest, datetime.now(UTC) - timedelta(seconds=5))
    token = mint(sqlite_url, role="ingest", name="serving")
    admin = mint(sqlite_url, role="admin", name="ops")
    server = ApiServer(sqlite_url, tmp_path / "home").start()
    upstream_port = free_port()
    upstream = _Thread(uvicorn.Config(_fake_vllm(), host="127.0.0.1", port=upstream_port,
                                      log_level="warning"))  # fmt: skip
    threading.Thread(target=upstream.run, daemon=True).start()
    tagger = Tagger(server.url, token, tmp_path / "spool", flush_interval=0.05)
    try:
        while not upstream.started:
            time.sleep(0.05)
        app = create_proxy_app(deployment="vllm-prod", upstream=f"http://127.0.0.1:{upstream_port}",
                               settings=Settings(), spool_dir=tmp_path / "spool",
                               backend=PairregClient(server.url, token=admin), tagger=tagger,
                               refresh_s=60)  # fmt: skip
        with TestClient(app) as proxy:
            plain = proxy.post("/v1/completions", json={"model": "m", "prompt": "hi"},
                               headers={"x-request-id": "v-plain"})  # fmt: skip
            assert plain.status_code == 200
            assert plain.headers["x-request-id"] == "v-plain"
            assert plain.headers["x-pairreg-pair-digest"] == pair.pair_digest
            streamed = proxy.post("/v1/completions",
                                  json={"model": "m", "prompt": "hi", "stream": True})  # fmt: skip
            assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
            stream_id = streamed.headers["x-request-id"]
        assert tagger.flush(60)
        ops = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"})
        for rid in ("v-plain", stream_id):
            tag = ops.get(f"/v1/requests/{rid}").json()["tag"]
            assert tag["pair_digest"] == pair.pair_digest and tag["consistent"]
            assert (tag["input_tokens"], tag["output_tokens"]) == (5, 11)
            assert tag["spec"]["num_accepted_draft_tokens"] == 7
            assert tag["spec"]["acceptance_histogram"] == [1, 1, 2, 0]
        listed = ops.get("/v1/requests", params={"deployment": "vllm-prod"}).json()
        assert listed["counts"]["total"] == 2  # each request tagged exactly once
        assert tagger.stats["tagged"] == 2 and tagger.stats["rejected"] == 0
    finally:
        tagger.close()
        upstream.should_exit = True
        server.stop()
