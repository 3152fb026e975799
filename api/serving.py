"""Embedded serving, one pipeline behind ``/v1/completions`` and ``/v1/chat/completions``:
generate → tag → respond.

``model`` names the deployment; the pair live on it now generates (speculative decoding,
greedy), through the parts measurement uses: the registry's operations (as the caller) to
find the live pair and to tag, ``registry.artifacts.materialize`` so only registered bytes load, and
the runner's ``build_engine`` (:mod:`api.engines`: one engine per pair digest, a load lock
per pair, a generation lock per engine). Completions encode the prompt as the target's
tokenizer does by default; chat renders the messages with the target's chat template and
the generation prompt, as a measurement on a chat suite does, so the α a pair was
validated with is the α its chat traffic sees.

A request takes a generation slot (``PAIRREG_SERVE_*``: 503 beyond the process's share,
429 beyond its token's) before it looks up or loads its engine, and gives it back when its
generation ends. The look-up, the generation and the tagging run in the ``serve`` lane
(:mod:`api.lanes`), never in the read or write lanes nor Starlette's shared pool.

Streaming is real: the runner yields each verified step's tokens
(:meth:`runner.engine.SpeculativeEngine.stream`), the engine turns them into new text and
each piece goes out as one SSE chunk at once; the chunks join to the non-streamed text.
Errors found before the first token (no live pair, a model that does not load, no chat
template) are answered as problems, not as a stream.

Every request is tagged with its pair here, before a stream's ``[DONE]``; the response
carries ``x-request-id`` and ``x-pairreg-pair-digest`` (a ``pairreg proxy`` in front reads
it and does not tag again), vLLM's per-request ``metrics.speculative_decoding`` counters
and a GenAI span (OpenTelemetry semantic conventions).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from api import tracing
from api.auth import Principal
from api.backend import local_backend
from api.engines import Generation, engine_cache, generation_slots
from api.lanes import lanes
from registry.errors import InvalidInput, NotFound
from registry.tables import utcnow

# ---------------------------------------------------------------------------- requests


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


@dataclass
class Job:
    """One served request, whichever route it came by."""

    chat: bool
    model: str
    prompts: list[Any]  # raw strings, or one message list (chat)
    max_tokens: int
    request_id: str
    stream: bool
    include_usage: bool
    created: int = field(default_factory=lambda: int(time.time()))
    served_at: Any = field(default_factory=utcnow)

    @property
    def operation(self) -> str:
        return tracing.CHAT if self.chat else tracing.TEXT_COMPLETION


def _check_greedy(temperature: float | None) -> None:
    if temperature not in (None, 0, 0.0):
        raise InvalidInput(
            "embedded serving is greedy only: temperature must be 0", field="temperature"
        )


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


def _request_id(request: Request, prefix: str) -> str:
    return request.headers.get("x-request-id") or f"{prefix}-{uuid.uuid4().hex}"


def completion_job(body: CompletionRequest, request: Request) -> Job:
    _check_greedy(body.temperature)
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts:
        raise InvalidInput("prompt must not be empty", field="prompt")
    _check_caps(request, len(prompts), body.max_tokens, "max_tokens")
    return Job(
        chat=False, model=body.model, prompts=prompts, max_tokens=body.max_tokens,
        request_id=_request_id(request, "cmpl"), stream=body.stream,
        include_usage=bool((body.stream_options or {}).get("include_usage")),
    )  # fmt: skip


def chat_job(body: ChatCompletionRequest, request: Request) -> Job:
    _check_greedy(body.temperature)
    max_tokens = body.max_completion_tokens or body.max_tokens or 16
    field_ = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    _check_caps(request, 1, max_tokens, field_)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    return Job(
        chat=True, model=body.model, prompts=[messages], max_tokens=max_tokens,
        request_id=_request_id(request, "chatcmpl"), stream=body.stream,
        include_usage=bool((body.stream_options or {}).get("include_usage")),
    )  # fmt: skip


# ------------------------------------------------------------------- generate and tag


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


def _start_span(request: Request, job: Job, engine: Any) -> Span:
    """A GenAI span (OpenTelemetry semantic conventions) around one served request; not
    made current, since a stream's generation ends in another thread than it began."""
    return request.app.state.tracer.start_span(  # type: ignore[no-any-return]
        tracing.span_name(job.operation, job.model),
        kind=SpanKind.INTERNAL,
        attributes={
            tracing.OPERATION_NAME: job.operation,
            tracing.PROVIDER_NAME: "pairreg",
            tracing.REQUEST_MODEL: job.model,
            tracing.REQUEST_MAX_TOKENS: job.max_tokens,
            tracing.DEPLOYMENT: job.model,
            tracing.REQUEST_ID: job.request_id,
            **tracing.pair_attributes(
                engine.pair_digest, engine.target_digest, engine.draft_digest
            ),
        },
    )


class _Stopped(Exception):
    """The client went away mid-stream: stop generating."""


@dataclass
class _Served:
    """A request's generation, from its slot to its tag; ``run`` is the lane's work."""

    job: Job
    backend: Any
    engine: Any
    span: Span
    release: Callable[[], None]
    emit: Callable[[tuple[Any, ...]], None] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    runs: list[Generation] = field(default_factory=list)
    spec: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    work: asyncio.Future[None] | None = None

    def _piece(self, index: int) -> Callable[[str], None] | None:
        if self.emit is None:
            return None
        emit = self.emit

        def on_text(text: str) -> None:
            if self.stop.is_set():
                raise _Stopped
            emit(("text", index, text))

        return on_text

    def run(self) -> None:
        """Generate every prompt, tag, end the span and give the slot back (a stream hears
        of each step, each choice's end, then ``done`` or ``error``)."""
        job = self.job
        try:
            for i, prompt in enumerate(job.prompts):
                g = self.engine.generate(prompt, job.max_tokens, on_text=self._piece(i))
                self.runs.append(g)
                if self.emit is not None:
                    self.emit(("end", i, g))
            self.spec, self.usage = _spec(self.runs), _usage(self.runs)
            reasons = [{"finish_reason": g.finish_reason} for g in self.runs]
            self.span.set_attributes(
                tracing.response_attributes(
                    {"id": job.request_id, "model": job.model, "usage": self.usage,
                     "choices": reasons},
                    self.spec,
                )
            )  # fmt: skip
            _tag(self.backend, job.request_id, job.model, self.engine, job.served_at,
                 self.usage, self.spec)  # fmt: skip
        except BaseException as exc:
            if not isinstance(exc, _Stopped):
                self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            if self.emit is None:
                raise
            self.emit(("error", exc))
        else:
            if self.emit is not None:
                self.emit(("done",))
        finally:
            self.span.end()
            self.release()


# ---------------------------------------------------------------------------- respond


async def serve(job: Job, request: Request, principal: Principal) -> Any:
    """Generate → tag → respond, for either route."""
    app = request.app
    lane = lanes(request).serve
    hold = generation_slots(app).hold(principal.actor)
    hold.__enter__()  # a 429/503 here, before anything loads
    released = threading.Event()

    def release() -> None:
        if not released.is_set():
            released.set()
            hold.__exit__(None, None, None)

    try:
        backend, engine = await lane.run(_live_engine, job.model, request, principal)
        span = _start_span(request, job, engine)
    except BaseException:
        release()
        raise
    headers = {"x-request-id": job.request_id, "x-pairreg-pair-digest": engine.pair_digest}
    served = _Served(job, backend, engine, span, release)
    if not job.stream:
        await lane.run(served.run)
        return JSONResponse(_body(served), headers=headers)

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
    served.emit = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)
    work = asyncio.ensure_future(lane.run(served.run))
    served.work = work  # kept referenced until it ends
    first = await queue.get()
    if first[0] == "error":  # nothing sent yet: answered as a problem
        await work
        raise first[1]
    return EventSourceResponse(_events(served, first, queue), headers=headers, sep="\n")


def _body(served: _Served) -> dict[str, Any]:
    job, runs = served.job, served.runs
    metrics = {"speculative_decoding": served.spec}
    if job.chat:
        g = runs[0]
        choice = {"index": 0, "message": {"role": "assistant", "content": g.text},
                  "logprobs": None, "finish_reason": g.finish_reason}  # fmt: skip
        return {"id": job.request_id, "object": "chat.completion", "created": job.created,
                "model": job.model, "choices": [choice], "usage": served.usage,
                "metrics": metrics}  # fmt: skip
    choices = [
        {"index": i, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason}
        for i, g in enumerate(runs)
    ]
    return {"id": job.request_id, "object": "text_completion", "created": job.created,
            "model": job.model, "choices": choices, "usage": served.usage,
            "metrics": metrics}  # fmt: skip


def _chunk(job: Job, choices: list[dict[str, Any]], **extra: Any) -> str:
    kind = "chat.completion.chunk" if job.chat else "text_completion"
    return json.dumps({"id": job.request_id, "object": kind, "created": job.created,
                       "model": job.model, "choices": choices, **extra})  # fmt: skip


def _choice(job: Job, index: int, text: str | None, finish: str | None) -> dict[str, Any]:
    if job.chat:
        delta = {} if text is None else {"content": text}
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}


async def _events(
    served: _Served, first: tuple[Any, ...], queue: asyncio.Queue[tuple[Any, ...]]
) -> AsyncIterator[str]:
    """The SSE stream: OpenAI's chunk shapes, one content chunk per verified step."""
    job = served.job
    try:
        if job.chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}  # fmt: skip
            yield _chunk(job, [role])
        item = first
        while True:
            kind = item[0]
            if kind == "text":
                yield _chunk(job, [_choice(job, item[1], item[2], None)])
            elif kind == "end":
                yield _chunk(job, [_choice(job, item[1], None, item[2].finish_reason)])
            elif kind == "error":
                exc = item[1]
                problem = {"message": str(exc), "type": getattr(exc, "kind", "internal"),
                           "code": getattr(exc, "status", 500)}  # fmt: skip
                yield json.dumps({"error": problem})
                return
            else:  # done: generated and tagged
                if job.include_usage:
                    yield _chunk(job, [], usage=served.usage,
                                 metrics={"speculative_decoding": served.spec})  # fmt: skip
                yield "[DONE]"
                return
            item = await queue.get()
    finally:
        # a client gone mid-stream stops the generation at its next step; the lane's work
        # then ends the span and gives the slot back by itself
        served.stop.set()
