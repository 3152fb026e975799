"""Bounded requests: bodies over their route family's cap are refused (413) before the app
reads them, chunked or not; slow bodies (408) and slow headers (closed) cannot hold the
server; a full ingest batch fits its family's cap."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.app import create_app
from api.limits import BodyLimit, BodyLimits
from registry.records.requests import MAX_BATCH
from registry.settings import Settings
from tests.serve_process import ApiServer

SMALL = BodyLimits(default=1000, results=4000, ingest=10_000, body_timeout=5.0)


class Recorder:
    """An ASGI app that records what reached it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})


def _call(app: Any, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def _problem(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.headers["connection"] == "close"
    body = resp.json()
    assert body["status"] == status and body["field"] == "body" and body["detail"]
    return body


def test_families_and_caps() -> None:
    limits = BodyLimits()
    assert limits.family("/v1/requests") == "ingest"
    assert limits.family("/v1/telemetry/prometheus") == "ingest"
    assert limits.family("/v1/measurements") == "results"
    assert limits.family("/v1/jobs/7/complete") == "results"
    assert limits.family("/v1/artifacts") == "default"
    assert limits.family("/v1/requests/abc/reconstruct") == "default"
    assert limits.default < limits.results < limits.ingest
    settings = Settings(max_body_bytes=5, max_results_body_bytes=6, max_ingest_body_bytes=7)
    assert BodyLimits.from_settings(settings).limit_for("/v1/requests") == 7


def test_declared_length_over_cap_is_refused_unread() -> None:
    app = Recorder()
    guarded = BodyLimit(app, SMALL)
    body = _problem(_call(guarded, "POST", "/v1/artifacts", content=b"x" * 1001), 413)
    assert body["kind"] == "too_large" and "1000 bytes" in body["detail"]
    assert app.bodies == []  # the app never ran
    ok = _call(guarded, "POST", "/v1/artifacts", content=b"x" * 1000)  # exactly the cap
    assert ok.status_code == 200 and ok.text == "1000"
    # the same size is fine on the ingest family, whose cap is larger
    assert _call(guarded, "POST", "/v1/requests", content=b"x" * 9000).text == "9000"
    _problem(_call(guarded, "POST", "/v1/requests", content=b"x" * 10_001), 413)
    assert [len(b) for b in app.bodies] == [1000, 9000]


def test_chunked_upload_is_cut_at_the_cap() -> None:
    app = Recorder()
    guarded = BodyLimit(app, SMALL)
    produced: list[int] = []

    async def stream() -> AsyncIterator[bytes]:
        for i in range(100):  # 100 kB in 1 kB chunks, no Content-Length
            produced.append(i)
            yield b"y" * 1000

    resp = _call(guarded, "POST", "/v1/requests", content=stream())
    _problem(resp, 413)
    assert app.bodies == []
    assert len(produced) <= 12  # read up to the cap (10 chunks) and no further

    async def small() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"z" * 1000

    assert _call(guarded, "POST", "/v1/requests", content=small()).text == "3000"
    assert app.bodies == [b"z" * 3000]


def test_slow_body_is_refused() -> None:
    app = Recorder()
    guarded = BodyLimit(app, BodyLimits(body_timeout=0.3))

    async def trickle() -> AsyncIterator[bytes]:
        yield b"{"
        await asyncio.sleep(30)
        yield b"}"

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await asyncio.wait_for(
                client.post("/v1/artifacts", content=trickle()), timeout=20
            )

    body = _problem(asyncio.run(go()), 408)
    assert body["kind"] == "timeout"
    assert app.bodies == []


def test_bodyless_requests_pass_untouched() -> None:
    app = Recorder()
    guarded = BodyLimit(app, SMALL)
    assert _call(guarded, "GET", "/v1/pairs").text == "0"
    assert app.bodies == [b""]


def test_app_wires_the_limit(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, max_body_bytes=2000, max_ingest_body_bytes=50_000)
    app = create_app(settings)
    tags = {"tags": [{"request_id": f"r{i}", "deployment": "d"} for i in range(5000)]}
    _problem(_call(app, "POST", "/v1/requests", json=tags), 413)
    big_register = {"source": "/x" * 2000, "name": "a/b", "role": "target"}
    _problem(_call(app, "POST", "/v1/artifacts", json=big_register), 413)
    # within the cap the request goes on to authentication, which has the last word
    resp = _call(app, "POST", "/v1/requests", json={"tags": []})
    assert resp.status_code == 401


def test_a_full_ingest_batch_fits_the_default_cap() -> None:
    """A largest batch with long ids, digests and per-request counters is under the cap,
    with room to spare, so a Tagger never meets the 413."""
    now = datetime.now(UTC).isoformat()
    tag = {
        "request_id": "r" * 100,
        "deployment": "d" * 40,
        "pair_digest": "f" * 64,
        "served_at": now,
        "input_tokens": 123456,
        "output_tokens": 65536,
        "spec": {
            "num_spec_steps": 10**6,
            "num_draft_tokens": 10**7,
            "num_accepted_draft_tokens": 10**7,
            "acceptance_histogram": [10**5] * 9,
        },
    }
    size = len(json.dumps({"tags": [tag] * MAX_BATCH}).encode())
    cap = BodyLimits().ingest
    assert size < cap / 2, (size, cap)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_real_server_refuses_huge_and_slow_requests(tmp_path: Path) -> None:
    """Against ``pairreg serve``: 64 MB bodies (declared and chunked) leave the server's
    peak memory where it was; a trickled header is cut off; the server still answers."""
    env = {"PAIRREG_HEADER_TIMEOUT": "1", "PAIRREG_BODY_TIMEOUT": "1"}
    server = ApiServer(None, tmp_path / "home", env=env).start()
    try:
        assert server.proc is not None
        with httpx.Client(base_url=server.url, timeout=30) as client:
            client.get("/healthz")
            before = _rss_kb(server.proc.pid)
            blob = b"[" + b"1," * (32 * 1024 * 1024) + b"1]"  # 64 MiB of valid JSON
            resp = client.post("/v1/requests", content=blob)
            assert resp.status_code == 413, resp.text

            def chunks() -> Any:
                for _ in range(64):
                    yield b" " * (1024 * 1024)

            resp = client.post("/v1/requests", content=chunks())
            assert resp.status_code == 413, resp.text
            after = _rss_kb(server.proc.pid)
            assert after - before < 48 * 1024, (before, after)  # far less than one body

            # a slow body: headers promise 100 bytes, 10 arrive
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(
                    b"POST /v1/artifacts HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                    b"Content-Type: application/json\r\n\r\n0123456789"
                )
                answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:200]

            # a header trickled byte by byte is cut off by the header deadline
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                start = time.monotonic()
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                sock.settimeout(0.0)  # non-blocking: recv says at once whether it closed
                closed = False
                for _ in range(40):
                    try:
                        sock.sendall(b"X-Slow: a\r\n")
                        if sock.recv(1) == b"":
                            closed = True
                            break
                    except BlockingIOError:
                        pass
                    except (ConnectionError, BrokenPipeError):  # reset by the server: closed
                        closed = True
                        break
                    time.sleep(0.25)
                assert closed, f"still open after {time.monotonic() - start:.1f} s"
            assert client.get("/healthz").status_code == 200  # and the server still serves
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_proxy_caps_bodies_too(tmp_path: Path) -> None:
    """The OpenAI-compatible proxy forwards bodies whole: they are capped as well."""
    from api.proxy import create_proxy_app

    class NoRegistry:
        def get_deployment(self, name: str) -> Any:
            raise RuntimeError("no registry in this test")

    class Tags:
        stats: dict[str, int] = {}

        def tag(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("nothing is served here")

        def close(self) -> None:
            pass

    settings = Settings(home=tmp_path, max_results_body_bytes=4096)
    app = create_proxy_app(
        deployment="d",
        upstream="http://127.0.0.1:9",
        settings=settings,
        spool_dir=tmp_path / "spool",
        backend=NoRegistry(),
        tagger=Tags(),
    )
    big = {"model": "d", "prompt": "x" * 5000}
    _problem(_call(app, "POST", "/v1/completions", json=big), 413)
    small = _call(app, "POST", "/v1/completions", json={"model": "d", "prompt": "hi"})
    assert small.status_code == 502  # within the cap: forwarded (to an upstream that is down)
