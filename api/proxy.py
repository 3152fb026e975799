"""``pairreg proxy``: an OpenAI-compatible pass-through that tags every request it forwards.

It sits in front of vLLM (or any server speaking the OpenAI HTTP API) for one deployment:

* takes the caller's ``x-request-id`` or assigns one, and forwards it upstream;
* forwards ``/v1/completions`` and ``/v1/chat/completions`` bodies unchanged, streaming
  included (server-sent events are parsed with ``httpx-sse`` and passed on event by event,
  re-encoded with ``sse-starlette``);
* tags the request with the pair live on the deployment, as last read from the registry
  (refreshed every ``refresh_s`` seconds); the registry re-checks that claim at ingest and
  marks the tag inconsistent if that pair was not live at ``served_at``;
* copies vLLM's per-request ``metrics.speculative_decoding`` counters into the tag when the
  upstream returns them, and token counts from ``usage``;
* adds ``x-request-id`` and ``x-pairreg-pair-digest`` to the response.

For streams without usage, the proxy asks the upstream for it
(``stream_options.include_usage``) and removes that extra usage-only event before it reaches
a caller that did not ask for it, so the caller sees exactly the stream it requested.

Tags go through :class:`api.tagger.Tagger`: the proxy never waits on the registry, and
tags survive registry outages in the spool. Everything else (other paths, GET /v1/models)
is forwarded untouched and not tagged.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from httpx_sse import EventSource
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from sse_starlette import ServerSentEvent

from api import tracing
from api.limits import BodyLimit, BodyLimits
from registry.settings import Settings

HOP_HEADERS = {
    "host",
    "content-length",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-authorization",
    "accept-encoding",
}
TAGGED_PATHS = ("/v1/completions", "/v1/chat/completions")
# A pairreg server upstream (its embedded /v1/completions) tags every request itself and
# says so with this response header; the proxy then does not tag the request again.
UPSTREAM_TAGGED = "x-pairreg-pair-digest"


class LivePair:
    """The deployment's live pair digest, refreshed from the registry in the background."""

    def __init__(self, backend: Any, deployment: str, refresh_s: float):
        self.backend = backend
        self.deployment = deployment
        self.refresh_s = refresh_s
        self.digest: str | None = None
        self.parts: tuple[str | None, str | None] = (None, None)  # target, draft digests
        self.error: str | None = None
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="pairreg-proxy-live", daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        try:
            dep = self.backend.get_deployment(name=self.deployment)
            digest = dep.current_pair_digest
            if digest != self.digest:
                self.digest, self.parts = digest, (None, None)
            if digest and self.parts[0] is None:  # the parts' digests, for the spans
                pair = self.backend.get_pair(ref=digest)
                self.parts = (
                    pair.target.manifest_digest,
                    pair.drafter.manifest_digest if pair.drafter else None,
                )
            self.error = None
        except Exception as exc:  # noqa: BLE001 - keep the last known value
            self.error = str(exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()


def _spec_from(data: dict[str, Any]) -> dict[str, Any] | None:
    metrics = data.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    keys = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
    if not all(isinstance(spec.get(k), int) for k in keys):
        return None
    out = {k: spec[k] for k in keys}
    hist = spec.get("acceptance_histogram")
    out["acceptance_histogram"] = hist if isinstance(hist, list) else None
    return out


def create_proxy_app(
    *,
    deployment: str,
    upstream: str,
    settings: Settings,
    spool_dir: str | Path,
    refresh_s: float = 5.0,
    backend: Any = None,
    tagger: Any = None,
    provider_name: str = "vllm",
    tracer_provider: Any = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The proxy app; ``backend`` and ``tagger`` default to the CLI's backend and a Tagger.

    ``provider_name`` is the span's ``gen_ai.provider.name`` (the upstream engine);
    ``tracer_provider`` defaults to the ``OTEL_*`` settings (off when they say nothing);
    ``transport`` replaces the network to the upstream (tests mount an ASGI app).
    """
    from api.backend import get_backend
    from api.tagger import Tagger
    from registry.services.system import read_credentials

    backend = backend or get_backend(settings)
    if tagger is None:
        if not settings.url:
            raise ValueError("the proxy ships tags to a pairreg server: set PAIRREG_URL")
        token = settings.token or (read_credentials(settings.credentials_path) or {}).get("token")
        tagger = Tagger(settings.url, token, spool_dir)
    live = LivePair(backend, deployment, refresh_s)
    client = httpx.AsyncClient(
        base_url=upstream.rstrip("/"), timeout=httpx.Timeout(600.0), transport=transport
    )
    tracer = tracing.tracer(tracer_provider or tracing.provider_from_env())
    up = httpx.URL(upstream)

    def start_span(path: str, payload: Any, request_id: str, digest: str | None) -> Span:
        operation = tracing.CHAT if path.endswith("/chat/completions") else tracing.TEXT_COMPLETION
        model = payload.get("model") if isinstance(payload, dict) else None
        attrs: dict[str, Any] = {
            tracing.OPERATION_NAME: operation,
            tracing.PROVIDER_NAME: provider_name,
            tracing.DEPLOYMENT: deployment,
            tracing.REQUEST_ID: request_id,
            tracing.SERVER_ADDRESS: up.host,
            **tracing.pair_attributes(
                digest, *(live.parts if digest == live.digest else (None, None))
            ),
        }
        if up.port:
            attrs[tracing.SERVER_PORT] = up.port
        if isinstance(model, str):
            attrs[tracing.REQUEST_MODEL] = model
        if isinstance(payload, dict) and isinstance(payload.get("max_tokens"), int):
            attrs[tracing.REQUEST_MAX_TOKENS] = payload["max_tokens"]
        return tracer.start_span(
            tracing.span_name(operation, model if isinstance(model, str) else None),
            kind=SpanKind.CLIENT,
            attributes=attrs,
        )

    def end_span(span: Span, status: int | None, error: str | None = None) -> None:
        if error is None and status is not None and status >= 400:
            error = str(status)
        if error is not None:
            span.set_attribute(tracing.ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        live.stop()
        await client.aclose()
        tagger.close()

    app = FastAPI(title="pairreg proxy", description=__doc__, lifespan=lifespan)
    # Bodies are forwarded whole: cap them (a long prompt fits the results family's 8 MiB).
    cap = settings.max_results_body_bytes
    limits = BodyLimits(default=cap, results=cap, ingest=cap, body_timeout=settings.body_timeout)
    app.add_middleware(BodyLimit, limits=limits)
    app.state.live = live
    app.state.tagger = tagger

    def tag(request_id: str, served_at: datetime, usage: dict[str, Any] | None,
            spec: dict[str, Any] | None, digest: str | None) -> None:  # fmt: skip
        usage = usage or {}
        tagger.tag(
            request_id,
            deployment,
            served_at=served_at,
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            pair_digest=digest,
            spec=spec,
        )

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "deployment": deployment, "pair_digest": live.digest,
                "registry_error": live.error, "tagger": tagger.stats}  # fmt: skip

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def forward(path: str, request: Request) -> Response:
        url_path = "/" + path
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        tagged = request.method == "POST" and url_path in TAGGED_PATHS
        if not tagged:
            resp = await client.request(request.method, url_path, content=body, headers=headers,
                                        params=request.query_params)  # fmt: skip
            out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
            return Response(resp.content, status_code=resp.status_code, headers=out)

        request_id = request.headers.get("x-request-id") or f"pxy-{uuid.uuid4().hex}"
        headers["x-request-id"] = request_id
        digest = live.digest
        served_at = datetime.now(UTC)
        extra = {"x-request-id": request_id}
        if digest:
            extra["x-pairreg-pair-digest"] = digest
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            payload = None
        span = start_span(url_path, payload, request_id, digest)
        if not isinstance(payload, dict) or not payload.get("stream"):
            try:
                resp = await client.post(url_path, content=body, headers=headers)
            except httpx.HTTPError as exc:
                end_span(span, None, type(exc).__name__)
                return JSONResponse({"error": f"upstream unreachable: {exc}"}, 502, extra)
            out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
            if resp.status_code < 400:
                try:
                    data = resp.json()
                except ValueError:
                    data = {}
                data = data if isinstance(data, dict) else {}
                spec = _spec_from(data)
                span.set_attributes(tracing.response_attributes(data, spec))
                if UPSTREAM_TAGGED not in resp.headers:
                    tag(request_id, served_at, data.get("usage"), spec, digest)
            end_span(span, resp.status_code)
            return Response(
                resp.content, status_code=resp.status_code, headers=_merge(out, extra, resp)
            )

        asked_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        if not asked_usage:
            payload["stream_options"] = {**(payload.get("stream_options") or {}),
                                         "include_usage": True}  # fmt: skip
            body = json.dumps(payload).encode()
        req = client.build_request("POST", url_path, content=body, headers=headers)
        try:
            resp = await client.send(req, stream=True)
        except httpx.HTTPError as exc:
            end_span(span, None, type(exc).__name__)
            return JSONResponse({"error": f"upstream unreachable: {exc}"}, 502, extra)
        out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        if resp.status_code >= 400:
            content = await resp.aread()
            await resp.aclose()
            end_span(span, resp.status_code)
            return Response(content, status_code=resp.status_code, headers=_merge(out, extra, resp))
        upstream_tagged = UPSTREAM_TAGGED in resp.headers

        async def events() -> AsyncIterator[bytes]:
            usage: dict[str, Any] | None = None
            spec: dict[str, Any] | None = None
            seen: dict[str, Any] = {}  # id, model and finish reasons across the events
            completed = False
            try:
                async for sse in EventSource(resp).aiter_sse():
                    data = _json_object(sse.data)
                    if data is not None:
                        usage = data.get("usage") or usage
                        spec = _spec_from(data) or spec
                        for key in ("id", "model"):
                            if isinstance(data.get(key), str):
                                seen[key] = data[key]
                        for c in data.get("choices") or []:
                            if isinstance(c, dict) and c.get("finish_reason"):
                                seen.setdefault("choices", []).append(c)
                        if not asked_usage and not data.get("choices") and data.get("usage"):
                            continue  # the usage event we asked for, not the caller
                    if sse.data == "[DONE]":
                        completed = True
                    yield ServerSentEvent(
                        data=sse.data,
                        event=None if sse.event == "message" else sse.event,
                        id=sse.id or None,
                        retry=sse.retry,
                        sep="\n",
                    ).encode()
            finally:
                await resp.aclose()
                if (completed or usage is not None) and not upstream_tagged:
                    tag(request_id, served_at, usage, spec, digest)
                span.set_attributes(tracing.response_attributes({**seen, "usage": usage}, spec))
                end_span(span, resp.status_code, None if completed else "stream_incomplete")

        return StreamingResponse(
            events(), status_code=resp.status_code, headers=_merge(out, extra, resp)
        )

    return app


def _merge(out: dict[str, str], extra: dict[str, str], resp: httpx.Response) -> dict[str, str]:
    """Upstream headers plus ours: our request id always; the pair digest a pairreg upstream
    reports (the pair that generated the answer) over the one the proxy last saw live."""
    headers = {**out, **extra}
    if UPSTREAM_TAGGED in resp.headers:
        headers[UPSTREAM_TAGGED] = resp.headers[UPSTREAM_TAGGED]
    return headers


def _json_object(data: str) -> dict[str, Any] | None:
    if not data or data == "[DONE]":
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
