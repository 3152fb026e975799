"""The ingest route runs with cyclic GC paused once its body is in; nothing else does."""

from __future__ import annotations

import asyncio
import gc
import threading

from api.ingest_gc import IngestGcPause
from registry.requests import gc_pause


def _call(path: str, method: str = "POST", chunks: int = 2) -> list[bool]:
    seen: list[bool] = []

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())  # before the body
        while (await receive()).get("more_body"):
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())  # whole body in: the handler's part

    messages = [
        {"type": "http.request", "body": b"x", "more_body": i < chunks - 1} for i in range(chunks)
    ]

    async def receive():  # type: ignore[no-untyped-def]
        return messages.pop(0)

    async def send(message):  # type: ignore[no-untyped-def]
        pass

    scope = {"type": "http", "method": method, "path": path}
    asyncio.run(IngestGcPause(app)(scope, receive, send))
    return seen


def test_paused_after_the_body_and_resumed_after_the_request() -> None:
    assert gc.isenabled()
    assert _call("/v1/requests") == [True, True, False]
    assert gc.isenabled()
    assert _call("/v1/requests", method="GET") == [True, True, True]
    assert _call("/v1/pairs") == [True, True, True]


def test_overlapping_pauses_resume_once_the_last_ends() -> None:
    gc_pause.pause()
    done = threading.Event()

    def other() -> None:
        with gc_pause.gc_paused():
            assert not gc.isenabled()
        done.set()

    threading.Thread(target=other).start()
    done.wait(5)
    assert not gc.isenabled()  # the first pause still holds
    gc_pause.resume()
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with gc_pause.gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
