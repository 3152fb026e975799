"""Embedded serving: OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions``
for a deployment's live pair.

Completions encode the prompt exactly as the target's tokenizer does by default; chat
completions render the messages with the target's own chat template and the generation
prompt, exactly as a measurement on a chat suite renders them, so the α a pair was
validated with is the α its chat traffic sees.

``model`` names the deployment. The pair live on it now generates (speculative decoding,
greedy; CPU is fine for the tiny pairs), and every request is tagged with that pair in the
same process, so each completion is auditable like one served by vLLM behind ``pairreg
proxy``. Responses carry ``x-request-id`` and ``x-pairreg-pair-digest`` and vLLM's
per-request ``metrics.speculative_decoding`` counters.

Everything goes through the same parts as measurement: the registry's operations (as the
caller) to find the live pair and to tag, ``registry.materialize`` so only the registered
bytes load, and the runner's ``build_engine``. Engines are built once per app per pair
digest (:class:`api.engines.EngineCache`); the runner is imported on first use, so the API
process pays for torch only if it actually serves.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from opentelemetry.trace import Span, SpanKind
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from api import tracing
from api.auth import Principal, require
from api.backend import local_backend
from api.engines import Generation, engine_cache, generation_slots
from registry.errors import InvalidInput, NotFound
from registry.models import utcnow
from registry.roles import INGEST

router = APIRouter(tags=["serving"])


class CompletionRequest(BaseModel):
    """The OpenAI completions fields this server honours; others are accepted and ignored."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [{"model": "chat-prod", "prompt": "def add(a, b):",
                                         "max_tokens": 16}]},
    )  # fmt: skip

    model: str = Field(min_length=1, description="The deployment name.")
    prompt: str | list[str]
    max_tokens: int = Field(default=16, ge=1, le=1024)
    temperature: float | None = Field(default=None, description="Only greedy (0) is served.")
    stream: bool = False
    stream_options: dict[str, Any] | None = None


def _spec(runs: list[Generation]) -> dict[str, Any]:
    """vLLM's per-request counters, summed over the request's prompts."""
    hist: list[int] = []
    for g in runs:
        h = g.histogram
        hist = [a + b for a, b in zip(hist, h, strict=True)] if hist else h
    return {
        "num_spec_steps": sum(g.run.steps for g in runs),
        "num_draft_tokens": sum(g.run.drafted for g in runs),
        "num_accepted_draft_tokens": sum(g.run.accepted for g in runs),
        "acceptance_histogram": hist or None,
    }


def _live_engine(model: str, request: Request, principal: Principal) -> tuple[Any, Any]:
    """(backend, loaded engine) for the pair live on deployment ``model`` now."""
    settings = request.app.state.settings
    backend = local_backend(settings, actor=principal.actor)
    try:
        dep = backend.get_deployment(name=model)
    except NotFound as exc:
        raise NotFound(str(exc), field="model") from exc
    if dep.current_pair_digest is None:
        raise InvalidInput(f"deployment {model} has no live pair", field="model")
    return backend, engine_cache(request.app).get(backend, dep.current_pair_digest)


def _check_caps(request: Request, prompts: int, max_tokens: int, field: str) -> None:
    """The per-request limits (settings ``serve_max_prompts`` and ``serve_max_tokens``):
    a request asking for more is the client's to fix, a 422 naming the field."""
    settings = request.app.state.settings
    if prompts > settings.serve_max_prompts:
        raise InvalidInput(
            f"at most {settings.serve_max_prompts} prompts per request, got {prompts}",
            field="prompt",
        )
    if max_tokens > settings.serve_max_tokens:
        raise InvalidInput(
            f"{field} must be at most {settings.serve_max_tokens}, got {max_tokens}", field=field
        )


def _check_greedy(temperature: float | None) -> None:
    if temperature not in (None, 0, 0.0):
        raise InvalidInput(
            "embedded serving is greedy only: temperature must be 0", field="temperature"
        )


def _usage(runs: list[Generation]) -> dict[str, int]:
    usage = {
        "prompt_tokens": sum(g.prompt_tokens for g in runs),
        "completion_tokens": sum(len(g.run.output_ids) for g in runs),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def _tag(
    backend: Any, request_id: str, deployment: str, engine: Any, served_at: Any,
    usage: dict[str, int], spec: dict[str, Any],
) -> None:  # fmt: skip
    """Always tagged here, whoever calls; the x-pairreg-pair-digest response header tells
    a `pairreg proxy` in front that this request is already recorded."""
    backend.ingest_requests(
        tags=[
            {
                "request_id": request_id,
                "deployment": deployment,
                "pair_digest": engine.pair_digest,
                "served_at": served_at,
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "spec": spec,
            }
        ]
    )


@contextmanager
def _span(
    request: Request, operation: str, model: str, max_tokens: int, request_id: str, engine: Any
) -> Iterator[Span]:
    """A GenAI span (OpenTelemetry semantic conventions) around one served request."""
    with request.app.state.tracer.start_as_current_span(
        tracing.span_name(operation, model),
        kind=SpanKind.INTERNAL,
        attributes={
            tracing.OPERATION_NAME: operation,
            tracing.PROVIDER_NAME: "pairreg",
            tracing.REQUEST_MODEL: model,
            tracing.REQUEST_MAX_TOKENS: max_tokens,
            tracing.DEPLOYMENT: model,
            tracing.REQUEST_ID: request_id,
            **tracing.pair_attributes(
                engine.pair_digest, engine.target_digest, engine.draft_digest
            ),
        },
    ) as span:
        yield span


@router.post(
    "/v1/completions",
    summary="OpenAI-compatible completions served by the deployment's live pair (tagged)",
)
def completions(
    body: CompletionRequest,
    request: Request,
    principal: Principal = Depends(require(INGEST)),
) -> Any:
    _check_greedy(body.temperature)
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts:
        raise InvalidInput("prompt must not be empty", field="prompt")
    _check_caps(request, len(prompts), body.max_tokens, "max_tokens")
    request_id = request.headers.get("x-request-id") or f"cmpl-{uuid.uuid4().hex}"
    served_at = utcnow()
    with generation_slots(request.app).hold(principal.actor):
        backend, engine = _live_engine(body.model, request, principal)
        with _span(request, tracing.TEXT_COMPLETION, body.model, body.max_tokens, request_id,
                   engine) as span:  # fmt: skip
            runs = [engine.generate(p, body.max_tokens) for p in prompts]
            choices = [
                {"index": i, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason}
                for i, g in enumerate(runs)
            ]
            spec = _spec(runs)
            usage = _usage(runs)
            span.set_attributes(
                tracing.response_attributes(
                    {"id": request_id, "model": body.model, "usage": usage, "choices": choices},
                    spec,
                )
            )
    _tag(backend, request_id, body.model, engine, served_at, usage, spec)
    headers = {"x-request-id": request_id, "x-pairreg-pair-digest": engine.pair_digest}
    base = {"id": request_id, "object": "text_completion", "created": int(time.time()),
            "model": body.model}  # fmt: skip
    if not body.stream:
        return JSONResponse(
            {**base, "choices": choices, "usage": usage,
             "metrics": {"speculative_decoding": spec}},
            headers=headers,
        )  # fmt: skip
    include_usage = bool((body.stream_options or {}).get("include_usage"))

    def events() -> Iterator[str]:
        for c in choices:
            text = c["text"]
            for start in range(0, len(text), 8):
                piece = {"index": c["index"], "text": text[start : start + 8],
                         "logprobs": None, "finish_reason": None}  # fmt: skip
                yield json.dumps({**base, "choices": [piece]})
            last = {**c, "text": ""}
            yield json.dumps({**base, "choices": [last]})
        if include_usage:
            final = {**base, "choices": [], "usage": usage,
                     "metrics": {"speculative_decoding": spec}}  # fmt: skip
            yield json.dumps(final)
        yield "[DONE]"

    return EventSourceResponse(events(), headers=headers, sep="\n")


class ChatMessage(BaseModel):
    """One OpenAI chat message; content as a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidInput("only text content parts are served", field="messages.content")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(BaseModel):
    """The OpenAI chat-completions fields this server honours; others are accepted and
    ignored."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [{"model": "chat-prod", "max_tokens": 16,
                                         "messages": [{"role": "user", "content": "Hi!"}]}]},
    )  # fmt: skip

    model: str = Field(min_length=1, description="The deployment name.")
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=1024)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1024)
    temperature: float | None = Field(default=None, description="Only greedy (0) is served.")
    n: int = Field(default=1, ge=1, le=1, description="One choice per request.")
    stream: bool = False
    stream_options: dict[str, Any] | None = None


@router.post(
    "/v1/chat/completions",
    summary="OpenAI-compatible chat completions served by the deployment's live pair, "
    "rendered with the target's chat template (tagged)",
)
def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    principal: Principal = Depends(require(INGEST)),
) -> Any:
    _check_greedy(body.temperature)
    max_tokens = body.max_completion_tokens or body.max_tokens or 16
    field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    _check_caps(request, 1, max_tokens, field)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    request_id = request.headers.get("x-request-id") or f"chatcmpl-{uuid.uuid4().hex}"
    served_at = utcnow()
    with generation_slots(request.app).hold(principal.actor):
        backend, engine = _live_engine(body.model, request, principal)
        with _span(request, tracing.CHAT, body.model, max_tokens, request_id, engine) as span:
            g = engine.generate(messages, max_tokens)
            spec = _spec([g])
            usage = _usage([g])
            span.set_attributes(
                tracing.response_attributes(
                    {"id": request_id, "model": body.model, "usage": usage,
                     "choices": [{"finish_reason": g.finish_reason}]},
                    spec,
                )
            )  # fmt: skip
    _tag(backend, request_id, body.model, engine, served_at, usage, spec)
    headers = {"x-request-id": request_id, "x-pairreg-pair-digest": engine.pair_digest}
    created = int(time.time())
    if not body.stream:
        message = {"role": "assistant", "content": g.text}
        return JSONResponse(
            {"id": request_id, "object": "chat.completion", "created": created,
             "model": body.model,
             "choices": [{"index": 0, "message": message, "logprobs": None,
                          "finish_reason": g.finish_reason}],
             "usage": usage, "metrics": {"speculative_decoding": spec}},
            headers=headers,
        )  # fmt: skip
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    base = {"id": request_id, "object": "chat.completion.chunk", "created": created,
            "model": body.model}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return json.dumps({**base, "choices": [choice]})

    def events() -> Iterator[str]:
        yield chunk({"role": "assistant", "content": ""}, None)
        for start in range(0, len(g.text), 8):
            yield chunk({"content": g.text[start : start + 8]}, None)
        yield chunk({}, g.finish_reason)
        if include_usage:
            yield json.dumps({**base, "choices": [], "usage": usage,
                              "metrics": {"speculative_decoding": spec}})  # fmt: skip
        yield "[DONE]"

    return EventSourceResponse(events(), headers=headers, sep="\n")
