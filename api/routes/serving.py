"""Embedded serving: an OpenAI-compatible ``/v1/completions`` for a deployment's live pair.

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
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from api import tracing
from api.auth import Principal, require
from api.backend import local_backend
from api.engines import Generation, engine_cache
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


def _answer(
    runs: list[Generation], max_tokens: int
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, int]]:
    """The choices, vLLM's spec-decode counters and the usage of one request."""
    choices = [
        {
            "index": i,
            "text": g.text,
            "logprobs": None,
            "finish_reason": "length" if len(g.run.output_ids) >= max_tokens else "stop",
        }
        for i, g in enumerate(runs)
    ]
    usage = {
        "prompt_tokens": sum(g.prompt_tokens for g in runs),
        "completion_tokens": sum(len(g.run.output_ids) for g in runs),
    }
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return choices, _spec(runs), usage


@router.post(
    "/v1/completions",
    summary="OpenAI-compatible completions served by the deployment's live pair (tagged)",
)
def completions(
    body: CompletionRequest,
    request: Request,
    principal: Principal = Depends(require(INGEST)),
) -> Any:
    if body.temperature not in (None, 0, 0.0):
        raise InvalidInput(
            "embedded serving is greedy only: temperature must be 0", field="temperature"
        )
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts:
        raise InvalidInput("prompt must not be empty", field="prompt")
    request_id = request.headers.get("x-request-id") or f"cmpl-{uuid.uuid4().hex}"
    served_at = utcnow()
    settings = request.app.state.settings
    backend = local_backend(settings, actor=principal.actor)
    try:
        dep = backend.get_deployment(name=body.model)
    except NotFound as exc:
        raise NotFound(str(exc), field="model") from exc
    if dep.current_pair_digest is None:
        raise InvalidInput(f"deployment {body.model} has no live pair", field="model")
    engine = engine_cache(request.app).get(backend, dep.current_pair_digest)
    with request.app.state.tracer.start_as_current_span(
        tracing.span_name(tracing.TEXT_COMPLETION, body.model),
        kind=SpanKind.INTERNAL,
        attributes={
            tracing.OPERATION_NAME: tracing.TEXT_COMPLETION,
            tracing.PROVIDER_NAME: "pairreg",
            tracing.REQUEST_MODEL: body.model,
            tracing.REQUEST_MAX_TOKENS: body.max_tokens,
            tracing.DEPLOYMENT: body.model,
            tracing.REQUEST_ID: request_id,
            **tracing.pair_attributes(
                engine.pair_digest, engine.target_digest, engine.draft_digest
            ),
        },
    ) as span:
        runs = [engine.generate(p, body.max_tokens) for p in prompts]
        choices, spec, usage = _answer(runs, body.max_tokens)
        span.set_attributes(
            tracing.response_attributes(
                {"id": request_id, "model": body.model, "usage": usage, "choices": choices},
                spec,
            )
        )
    # Always tagged here, whoever calls; the x-pairreg-pair-digest response header tells a
    # `pairreg proxy` in front that this request is already recorded.
    backend.ingest_requests(
        tags=[
            {
                "request_id": request_id,
                "deployment": body.model,
                "pair_digest": engine.pair_digest,
                "served_at": served_at,
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "spec": spec,
            }
        ]
    )
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
