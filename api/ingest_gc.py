"""``POST /v1/requests`` runs with the cyclic garbage collector paused.

A 10,000-tag body becomes some 100,000 Python objects (the parsed JSON, one validated model
per tag, the rows the service writes) that all live until the response is sent. The
collector, which runs every 700 net allocations, promotes them and then walks the whole
heap: measured at about 0.12 s of CPU per batch in a server process, more than parsing
and digesting the tags together, and it never finds anything to collect. Reference
counting frees everything as usual. The pause starts once the whole body has arrived (a
slow upload pauses nothing) and ends with the request (``registry.requests.gc_pause``: pauses nest
and may overlap across requests).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from registry.requests import gc_pause

PATHS = frozenset({"/v1/requests"})


class IngestGcPause:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope["path"] not in PATHS:
            await self.app(scope, receive, send)
            return
        paused = False

        async def receive_body() -> Message:
            nonlocal paused
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body") and not paused:
                gc_pause.pause()
                paused = True
            return message

        try:
            await self.app(scope, receive_body, send)
        finally:
            if paused:
                gc_pause.resume()
