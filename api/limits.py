"""Bounded requests: a body-size cap per route family and read deadlines.

Why a middleware and not a route check: FastAPI reads and parses the whole body before a
route (or a pydantic ``max_length``) can object, so a 90 MB JSON body costs about 1 GB of
server memory before its batch-size check answers 422. ``BodyLimit`` sits in front of the
app and counts bytes *as they arrive*: a ``Content-Length`` over the family's cap is
answered 413 at once, without reading a byte of the body; a chunked (or lying) upload is
answered 413 the moment its running total crosses the cap. Only a body within the cap is
handed on, so at most ``limit`` bytes are ever held per request.

The same middleware bounds how long a body may take to arrive (``body_timeout`` seconds in
all, answered 408), and ``bounded_protocol`` bounds how long a request's headers may take
(the connection is closed): together a slow client cannot pin a connection, a
threadpool slot or memory indefinitely. uvicorn itself has neither deadline, only the
idle keep-alive timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

MiB = 1024 * 1024


@dataclass(frozen=True)
class BodyLimits:
    """Caps in bytes per route family, and the body deadline in seconds.

    ``ingest``: ``POST /v1/requests`` (a full 10 000-tag batch with per-request counters is
    about 4 MB) and ``POST /v1/telemetry/prometheus`` (a scrape). ``results``: what a
    worker reports (``/v1/measurements``, ``/v1/jobs/…``): per-category, per-position
    counters. ``default``: every other route, whose bodies are a few fields.
    """

    default: int = 1 * MiB
    results: int = 8 * MiB
    ingest: int = 16 * MiB
    body_timeout: float = 60.0

    def family(self, path: str) -> str:
        if path == "/v1/requests" or path.startswith("/v1/telemetry/"):
            return "ingest"
        if path.startswith(("/v1/measurements", "/v1/jobs/")):
            return "results"
        return "default"

    def limit_for(self, path: str) -> int:
        return int(getattr(self, self.family(path)))

    @classmethod
    def from_settings(cls, settings: Any) -> BodyLimits:
        return cls(
            default=settings.max_body_bytes,
            results=settings.max_results_body_bytes,
            ingest=settings.max_ingest_body_bytes,
            body_timeout=settings.body_timeout,
        )


def _problem(status: int, title: str, detail: str, kind: str, field: str = "body") -> bytes:
    body = {
        "type": f"https://pairreg.dev/problems/{kind}",
        "title": title,
        "status": status,
        "detail": detail,
        "kind": kind,
        "field": field,
    }
    return json.dumps(body).encode()


class _Refused(Exception):
    def __init__(self, status: int, title: str, detail: str, kind: str):
        self.status, self.title, self.detail, self.kind = status, title, detail, kind


class BodyLimit:
    """Pure ASGI middleware: see the module docstring. Bodies within the cap are buffered
    (the app would buffer them anyway) and replayed to the app unchanged."""

    def __init__(self, app: ASGIApp, limits: BodyLimits | Callable[[], BodyLimits]):
        self.app = app
        self._limits = limits

    @property
    def limits(self) -> BodyLimits:
        return self._limits() if callable(self._limits) else self._limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if not chunked and (length is None or length.strip() in (b"", b"0")):
            await self.app(scope, receive, send)  # no body to bound
            return
        limits = self.limits
        path = scope.get("path", "")
        cap = limits.limit_for(path)
        try:
            if length is not None and not chunked:
                try:
                    declared = int(length)
                except ValueError:
                    raise _Refused(
                        400, "Bad request", "Content-Length is not a number", "invalid"
                    ) from None
                if declared > cap:
                    raise self._too_large(path, cap, limits)
            body = await self._read(receive, cap, path, limits)
        except _Refused as refused:
            await self._answer(send, refused)
            return
        await self.app(scope, _replay(body, receive), send)

    @staticmethod
    def _too_large(path: str, cap: int, limits: BodyLimits) -> _Refused:
        family = limits.family(path)
        return _Refused(
            413,
            "Content too large",
            f"body: larger than the {cap} bytes allowed for {family} routes ({path}); "
            "split it (ingest batches: at most 10000 tags)",
            "too_large",
        )

    async def _read(self, receive: Receive, cap: int, path: str, limits: BodyLimits) -> bytes:
        chunks: list[bytes] = []
        total = 0
        deadline = time.monotonic() + limits.body_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
            except TimeoutError:
                raise _Refused(
                    408,
                    "Request timeout",
                    f"body: not received within {limits.body_timeout:g} s",
                    "timeout",
                ) from None
            if message["type"] == "http.disconnect":
                raise _Refused(400, "Bad request", "client disconnected", "disconnected")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > cap:
                raise self._too_large(path, cap, limits)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _answer(send: Send, refused: _Refused) -> None:
        payload = _problem(refused.status, refused.title, refused.detail, refused.kind)
        await send(
            {
                "type": "http.response.start",
                "status": refused.status,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(payload)).encode()),
                    # The rest of the body is unread: this connection cannot carry another
                    # request, so tell the client to open a new one.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # later calls: wait for the disconnect, as the app expects

    return replay


def bounded_protocol(header_timeout: float) -> type:
    """uvicorn's HTTP protocol (httptools when installed, as uvicorn's ``auto`` picks, else
    h11) with a header deadline: a connection whose next request's headers have not
    arrived ``header_timeout`` seconds after it opened (or after its previous response) is
    closed. uvicorn's own keep-alive timeout closes *idle* connections sooner; this one
    also catches a client trickling a header byte by byte."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # pragma: no cover - httptools is a uvicorn[standard] extra
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class HeaderDeadlineProtocol(Base):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._header_timer: asyncio.TimerHandle | None = None
            self._arm_header_deadline()

        def _arm_header_deadline(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            waiting_since = self.cycle  # the request (None at first) before the awaited one
            self._header_timer = self.loop.call_later(
                header_timeout, self._header_deadline, waiting_since
            )

        def _header_deadline(self, waiting_since: object) -> None:
            self._header_timer = None
            idle = self.cycle is None or self.cycle.response_complete
            if self.cycle is waiting_since and idle and not self.transport.is_closing():
                self.transport.close()  # no new request's headers within the deadline

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

    return HeaderDeadlineProtocol
