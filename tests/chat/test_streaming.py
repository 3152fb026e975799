"""Embedded serving streams for real: each verified step goes out as its own SSE chunk the
moment the runner yields it (not the finished text cut up afterwards), and for greedy
decoding the streamed text is the non-streamed text, token counts and counters included.

The app runs under uvicorn in a thread (the test client buffers a response whole, which
would hide when a chunk was sent); only the deployment look-up and the tag are stood in
for, the engine below them is :class:`api.engines.LoadedEngine`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn

from api import serving
from api.app import create_app
from api.engines import LoadedEngine
from registry.settings import Settings
from tests.serve_process import free_port, mint

MESSAGES = [{"role": "user", "content": "Count to five."}]


class _Thread(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # run in a thread
        pass


@contextmanager
def _served(
    url: str, home: Path, engine: Any, tags: list[dict[str, Any]]
) -> Iterator[tuple[str, Any]]:
    """(base URL, app): the app on a free port, the deployment ``d`` live on ``engine``;
    tags recorded."""

    def live(model: str, request: Any, principal: Any) -> tuple[Any, Any]:
        assert model == "d"
        return None, engine

    def tag(backend: Any, request_id: str, deployment: str, eng: Any, served_at: Any,
            usage: dict[str, int], spec: dict[str, Any]) -> None:  # fmt: skip
        tags.append({"request_id": request_id, "usage": usage, "spec": spec})

    mp = pytest.MonkeyPatch()
    mp.setattr(serving, "_live_engine", live)
    mp.setattr(serving, "_tag", tag)
    port = free_port()
    app = create_app(Settings(database_url=url, home=home))
    server = _Thread(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(10)
        mp.undo()


def _data(line: str) -> Any:
    payload = line.removeprefix("data:").strip()
    return payload if payload == "[DONE]" else json.loads(payload)


class _Letters:
    """Token ``i`` is the letter ``chr(97 + i)``; 25 (``z``) ends a sequence."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        return {"input_ids": [ord(c) - 97 for c in text]}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - 97 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i) for i in ids if not (skip_special_tokens and i == 25))


class _GatedRunner:
    """Stands in for the runner's engine: yields fixed steps, the second one only once
    ``gate`` is set, and records what it yielded."""

    STEPS = [[0], [1, 2, 3], [4], [5, 6]]

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.yielded = 0

    def stream(self, ids: list[int], max_new_tokens: int) -> Any:
        out: list[int] = []
        for i, step in enumerate(self.STEPS):
            if i == 1:
                assert self.gate.wait(30), "the test never saw the first chunk"
            out += step
            self.yielded += 1
            yield step
        return SimpleNamespace(output_ids=out, steps=3, drafted=6, accepted=3,
                               accepted_per_position=[2, 1])  # fmt: skip


def test_the_first_chunk_leaves_before_generation_goes_on(sqlite_url: str, tmp_path: Path) -> None:
    """The runner is held after its first step until the client has read that step's text:
    were the finished text streamed (as before), the request would wait forever. Then one
    content chunk per step, in order, and the chunks join to the whole text."""
    runner = _GatedRunner()
    engine = LoadedEngine("a" * 64, SimpleNamespace(tokenizer=_Letters(), engine=runner, eos={25}))
    token = mint(sqlite_url, role="ingest", name="streamer")
    tags: list[dict[str, Any]] = []
    with _served(sqlite_url, tmp_path / "home", engine, tags) as (url, app):
        body = {"model": "d", "prompt": "abc", "max_tokens": 16, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        headers = {"Authorization": f"Bearer {token}", "x-request-id": "s-1"}
        events: list[Any] = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                          timeout=60) as resp:  # fmt: skip
            assert resp.status_code == 200
            assert resp.headers["x-pairreg-pair-digest"] == "a" * 64
            lines = (line for line in resp.iter_lines() if line.startswith("data:"))
            first = _data(next(lines))
            # the runner has yielded one step and waits: the chunk is that step's text
            assert runner.yielded == 1 and first["choices"][0]["text"] == "a"
            assert not tags  # not tagged before generation ends
            runner.gate.set()
            events = [first, *(_data(line) for line in lines)]
    assert events[-1] == "[DONE]"
    texts = [e["choices"][0]["text"] for e in events[:-1] if e["choices"]]
    finals = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    assert texts == ["a", "bcd", "e", "fg", ""]  # one chunk per verified step, then the end
    assert finals == [None, None, None, None, "length"]
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    assert usage["metrics"]["speculative_decoding"]["num_draft_tokens"] == 6
    assert [t["request_id"] for t in tags] == ["s-1"]  # tagged once, before [DONE]


def test_an_error_before_the_first_token_is_a_problem(sqlite_url: str, tmp_path: Path) -> None:
    """A chat to a target without a chat template, streamed: a 422 problem naming
    ``messages`` (not a 200 stream carrying an error), untagged, its slot given back."""
    runner = _GatedRunner()
    runner.gate.set()
    engine = LoadedEngine("a" * 64, SimpleNamespace(tokenizer=_Letters(), engine=runner, eos={25}))
    token = mint(sqlite_url, role="ingest", name="streamer")
    tags: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {token}"}
    with _served(sqlite_url, tmp_path / "home", engine, tags) as (url, app):
        body = {"model": "d", "messages": MESSAGES, "stream": True}
        # more refusals than this token's two slots: each gave its slot back
        for _ in range(3):
            r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
            assert r.status_code == 422, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["field"] == "messages" and "chat template" in r.json()["detail"]
        assert runner.yielded == 0 and not tags
        ok = httpx.post(f"{url}/v1/completions", headers=headers, timeout=60,
                        json={"model": "d", "prompt": "ab", "stream": True})  # fmt: skip
        assert ok.status_code == 200 and ok.text.rstrip().endswith("data: [DONE]")


def test_streamed_text_is_the_greedy_text(chat_models, sqlite_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real pair (the chat target with its one-layer draft): chat and completions, each
    streamed and not; the same text, usage and counters, and one content chunk per
    verified step at most (the prefill's token, then each draft-and-verify step)."""
    from runner import MeasureSettings
    from runner.build import build_engine

    settings = MeasureSettings(method="draft_model", k=3, temperature=0.0, max_new_tokens=24)
    built = build_engine(settings, str(chat_models.target), str(chat_models.draft))
    engine = LoadedEngine("b" * 64, built)
    token = mint(sqlite_url, role="ingest", name="streamer")
    tags: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {token}"}
    with _served(sqlite_url, tmp_path / "home", engine, tags) as (url, app):
        for path, body, content in (
            ("/v1/chat/completions", {"messages": MESSAGES},
             lambda c: c["delta"].get("content")),
            ("/v1/completions", {"prompt": "def add(a, b):"}, lambda c: c["text"] or None),
        ):  # fmt: skip
            request = {"model": "d", "max_tokens": 24, **body}
            whole = httpx.post(f"{url}{path}", json=request, headers=headers, timeout=120)
            assert whole.status_code == 200, whole.text
            done = whole.json()
            text = done["choices"][0].get("text") or done["choices"][0].get("message")["content"]
            streamed = httpx.post(
                f"{url}{path}", headers=headers, timeout=120,
                json={**request, "stream": True, "stream_options": {"include_usage": True}},
            )  # fmt: skip
            events = [_data(x) for x in streamed.text.splitlines() if x.startswith("data:")]
            assert events[-1] == "[DONE]"
            pieces = [content(e["choices"][0]) for e in events[:-1] if e["choices"]]
            pieces = [p for p in pieces if p]
            assert "".join(pieces) == text and text  # greedy: the same answer either way
            final = events[-2]
            assert final["usage"] == done["usage"]
            spec = done["metrics"]["speculative_decoding"]
            assert final["metrics"]["speculative_decoding"] == spec
            assert spec["num_spec_steps"] > 0
            # streamed step by step: several chunks, never more than the steps that
            # produced tokens (+1 for text a step held back to finish a character)
            assert 1 < len(pieces) <= spec["num_spec_steps"] + 2
    assert len(tags) == 4


class _LongRunner:
    """Yields a letter every 20 ms for up to 500 steps (10 s), counting them."""

    def __init__(self) -> None:
        self.yielded = 0

    def stream(self, ids: list[int], max_new_tokens: int) -> Any:
        out: list[int] = []
        for _ in range(500):
            time.sleep(0.02)
            out.append(0)
            self.yielded += 1
            yield [0]
        return SimpleNamespace(output_ids=out, steps=0, drafted=0, accepted=0,
                               accepted_per_position=[])  # fmt: skip


def test_a_client_that_leaves_stops_the_generation(sqlite_url: str, tmp_path: Path) -> None:
    """The client reads one chunk and hangs up: the generation stops at a later step
    (long before its 500), the engine's lock and the slot are given back, nothing tagged."""
    runner = _LongRunner()
    engine = LoadedEngine("a" * 64, SimpleNamespace(tokenizer=_Letters(), engine=runner, eos={25}))
    token = mint(sqlite_url, role="ingest", name="leaver")
    tags: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {token}"}
    with _served(sqlite_url, tmp_path / "home", engine, tags) as (url, app):
        body = {"model": "d", "prompt": "ab", "max_tokens": 256, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers,
                          timeout=60) as resp:  # fmt: skip
            assert resp.status_code == 200
            next(line for line in resp.iter_lines() if line.startswith("data:"))
        deadline = time.monotonic() + 30
        while engine.lock.locked() or app.state.generation_slots._in_flight:
            assert time.monotonic() < deadline, "the generation went on"
            time.sleep(0.05)
        assert 1 <= runner.yielded < 500 and not tags
        assert app.state.generation_slots._by_token == {}
