"""Chat serving: ``/v1/chat/completions`` on ``pairreg serve`` for a deployment's live
pair, called with the official openai client directly and through ``pairreg proxy``;
rendered with the target's chat template, tagged like completions."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.client import PairregClient
from api.proxy import create_proxy_app
from api.tagger import Tagger
from registry.db import session_scope
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from registry.settings import Settings
from runner.measure import plain_greedy
from runner.models import load_causal_lm, load_tokenizer
from runner.render import encode_chat
from tests.requests.conftest import ACTOR, promote_at
from tests.serve_process import ApiServer, free_port, mint

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2 + 2?"},
]


class _Thread(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # run in a thread
        pass


def _register(url: str, target: Path, draft: Path | None, name: str) -> str:
    with session_scope(url) as s:
        t = art_svc.add_artifact(s, source=str(target), name=f"{name}/target", role="target",
                                 actor=ACTOR).artifact  # fmt: skip
        d = None
        if draft is not None:
            d = art_svc.add_artifact(s, source=str(draft), name=f"{name}/draft", role="draft",
                                     actor=ACTOR).artifact  # fmt: skip
        pair = pair_svc.register_pair(
            s, target=t.ref, draft=d.ref if d else None,
            method="draft_model" if d else "prompt_lookup", k=3, actor=ACTOR,
        ).pair  # fmt: skip
    promote_at(url, f"{name}-prod", pair.pair_digest, datetime.now(UTC) - timedelta(seconds=5))
    return pair.pair_digest


def test_chat_completions_openai_client_direct_and_through_proxy(
    chat_models, sqlite_url: str, tmp_path: Path
) -> None:
    import openai
    from openai import OpenAI

    digest = _register(sqlite_url, chat_models.target, chat_models.draft, "chat")
    _register(sqlite_url, chat_models.no_template, None, "plain")
    token = mint(sqlite_url, role="ingest", name="serving")
    admin = mint(sqlite_url, role="admin", name="ops")
    # what the answer must be: the target's own greedy output on the template's rendering
    tok = load_tokenizer(chat_models.target)
    prompt_ids = encode_chat(tok, MESSAGES)
    ref = plain_greedy(load_causal_lm(chat_models.target), prompt_ids, 12)
    expected = tok.decode(ref, skip_special_tokens=True)

    server = ApiServer(sqlite_url, tmp_path / "home").start()
    tagger = Tagger(server.url, token, tmp_path / "spool", flush_interval=0.05)
    app = create_proxy_app(deployment="chat-prod", upstream=server.url, settings=Settings(),
                           spool_dir=tmp_path / "spool",
                           backend=PairregClient(server.url, token=admin), tagger=tagger,
                           refresh_s=60)  # fmt: skip
    port = free_port()
    proxy = _Thread(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=proxy.run, daemon=True)
    thread.start()
    try:
        direct = OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0)
        raw = direct.chat.completions.with_raw_response.create(
            model="chat-prod", messages=MESSAGES, max_tokens=12,
            extra_headers={"x-request-id": "chat-direct"},
        )  # fmt: skip
        assert raw.headers["x-pairreg-pair-digest"] == digest
        done = raw.parse()
        assert done.object == "chat.completion"
        assert done.choices[0].message.role == "assistant"
        assert done.choices[0].message.content == expected
        assert done.usage.prompt_tokens == len(prompt_ids)
        assert done.usage.completion_tokens == len(ref)
        stopped = ref[-1] in {256, 258}
        assert done.choices[0].finish_reason == ("stop" if stopped else "length")

        chunks = list(
            direct.chat.completions.create(
                model="chat-prod", messages=MESSAGES, max_tokens=12, stream=True,
                stream_options={"include_usage": True},
            )
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == expected
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage.completion_tokens == len(ref)

        with pytest.raises(openai.APIStatusError) as refused:
            direct.chat.completions.create(model="plain-prod", messages=MESSAGES, max_tokens=4)
        assert refused.value.status_code == 422
        problem = refused.value.response.json()
        assert problem["field"] == "messages" and "no chat template" in problem["detail"]

        while not proxy.started:
            time.sleep(0.05)
        via = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0)
        raw_p = via.chat.completions.with_raw_response.create(
            model="chat-prod", messages=MESSAGES, max_tokens=12,
            extra_headers={"x-request-id": "chat-proxied"},
        )  # fmt: skip
        assert raw_p.headers["x-pairreg-pair-digest"] == digest
        assert raw_p.parse().choices[0].message.content == expected
        streamed = via.chat.completions.create(
            model="chat-prod", messages=MESSAGES, max_tokens=12, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected

        assert tagger.flush(60)
        ops = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"})
        for rid in ("chat-direct", "chat-proxied"):
            tag = ops.get(f"/v1/requests/{rid}").json()["tag"]
            assert tag["pair_digest"] == digest and tag["consistent"]
            assert tag["input_tokens"] == len(prompt_ids)
            assert tag["output_tokens"] == len(ref)
            assert tag["spec"]["num_draft_tokens"] > 0
        page = ops.get("/v1/requests", params={"deployment": "chat-prod"}).json()
        assert page["counts"]["total"] == 4  # each request tagged once, by the server
        assert tagger.stats["tagged"] == 0
    finally:
        proxy.should_exit = True
        thread.join(10)
        tagger.close(5)
        server.stop()
