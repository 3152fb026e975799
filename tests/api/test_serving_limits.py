"""Embedded serving is bounded: prompts per request and ``max_tokens`` (422 naming the
field), generations in flight per process (503) and per token (429), both with
``Retry-After``; a model that loads delays only the requests for that pair."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from api import engines, serving
from api.engines import EngineCache
from registry.db import session_scope
from registry.services.tokens import create_token
from tests.api.conftest import ApiEnv


def test_prompts_and_max_tokens_are_capped(api: ApiEnv) -> None:
    api.app.state.settings = api.settings.model_copy(
        update={"serve_max_prompts": 3, "serve_max_tokens": 64}
    )
    h = api.auth("ingest")
    cases = [
        ("/v1/completions", {"model": "d", "prompt": ["x"] * 4}, "prompt"),
        ("/v1/completions", {"model": "d", "prompt": "x", "max_tokens": 65}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"model": "d", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100},
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "d",
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 65,
            },
            "max_completion_tokens",
        ),
    ]
    for path, body, field in cases:
        resp = api.client.post(path, json=body, headers=h)
        assert resp.status_code == 422, (path, body, resp.text)
        assert resp.json()["field"] == field
    # within the caps the request goes on (to the unknown deployment here)
    ok = api.client.post("/v1/completions", json={"model": "d", "prompt": ["x"] * 3}, headers=h)
    assert ok.status_code == 404 and ok.json()["field"] == "model"


class _Engine:
    """Generates once released; counts what ran at once."""

    pair_digest = "a" * 64
    target_digest = draft_digest = None

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def generate(self, prompt: Any, max_tokens: int, on_text: Any = None) -> Any:
        self.started.release()
        assert self.release.wait(30)
        run = SimpleNamespace(steps=1, drafted=1, accepted=1, output_ids=[1],
                              accepted_per_position=[1])  # fmt: skip
        return engines.Generation(text="ok", prompt_tokens=1, run=run)


def test_generations_in_flight_are_bounded(api: ApiEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two slots, one per token: a token's second request is a 429, a third token's is a
    503 while both slots are busy, each with Retry-After; after they finish, all pass."""
    api.app.state.settings = api.settings.model_copy(
        update={"serve_max_generations": 2, "serve_max_generations_per_token": 1}
    )
    engine = _Engine()
    monkeypatch.setattr(serving, "_live_engine", lambda model, request, principal: (None, engine))
    monkeypatch.setattr(serving, "_tag", lambda *a, **k: None)  # no deployment to tag here
    with session_scope(api.settings.db_url) as s:
        third = create_token(s, name="ingest-3", role="ingest", actor="test").secret
    body = {"model": "d", "prompt": "x"}
    answers: dict[str, Any] = {}

    def call(name: str, headers: dict[str, str]) -> None:
        answers[name] = api.client.post("/v1/completions", json=body, headers=headers)

    first = threading.Thread(target=call, args=("first", api.auth("ingest")))
    second = threading.Thread(target=call, args=("admin", api.auth("admin")))
    try:
        first.start()
        assert engine.started.acquire(timeout=30)
        second.start()
        assert engine.started.acquire(timeout=30)
        again = api.client.post("/v1/completions", json=body, headers=api.auth("ingest"))
        assert again.status_code == 429 and again.headers["retry-after"] == "1"
        assert again.json()["kind"] == "rate_limited"
        busy = api.client.post("/v1/completions", json=body, headers={
            "Authorization": f"Bearer {third}"})  # fmt: skip
        assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1
        assert busy.json()["kind"] == "unavailable"
    finally:
        engine.release.set()
        first.join(30)
        second.join(30)
    assert answers["first"].status_code == answers["admin"].status_code == 200
    after = api.client.post("/v1/completions", json=body, headers=api.auth("ingest"))
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == "ok"


def test_a_loading_model_delays_only_its_own_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = EngineCache(state_dir=None)
    gate = threading.Event()
    loads: list[str] = []

    def load(backend: Any, digest: str) -> Any:
        loads.append(digest)
        if digest == "slow":
            assert gate.wait(30)
        return SimpleNamespace(pair_digest=digest)

    monkeypatch.setattr(cache, "_load", load)
    got: dict[str, Any] = {}
    slow = [threading.Thread(target=lambda: got.setdefault("slow", cache.get(None, "slow")))
            for _ in range(2)]  # fmt: skip
    for t in slow:
        t.start()
    while not loads:
        time.sleep(0.01)
    fast = threading.Thread(target=lambda: got.setdefault("fast", cache.get(None, "fast")))
    fast.start()
    fast.join(5)
    assert not fast.is_alive() and got["fast"].pair_digest == "fast"  # not behind "slow"
    assert "slow" not in got
    gate.set()
    for t in slow:
        t.join(10)
    assert got["slow"].pair_digest == "slow" and loads.count("slow") == 1  # loaded once
