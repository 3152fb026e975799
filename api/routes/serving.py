"""Embedded serving: an OpenAI-compatible ``/v1/completions`` for a deployment's live pair.

``model`` names the deployment. The registry's runner generates with the pair live on it
now (speculative decoding, greedy, CPU is fine for the tiny pairs), and every request is
tagged with that pair in the same process, so each completion is auditable like one served
by vLLM behind ``pairreg proxy``. Responses carry ``x-request-id`` and
``x-pairreg-pair-digest`` and vLLM's per-request ``metrics.speculative_decoding`` counters.

Models load once per process per pair digest and stay cached; a lock per engine serialises
generation (the engine keeps one KV cache). The runner is imported on first use, so the API
process pays for torch only if it actually serves.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Principal, require
from registry.db import session_scope
from registry.errors import InvalidInput
from registry.models import Pair, utcnow
from registry.roles import INGEST
from registry.services import requests as req_svc

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


@dataclass
class _Loaded:
    tokenizer: Any
    engine: Any
    lock: threading.Lock


_ENGINES: dict[str, _Loaded] = {}
_ENGINES_LOCK = threading.Lock()


def _engine(pair: dict[str, Any]) -> _Loaded:
    """The pair's engine, built once per process by the runner's ``build_engine`` (greedy)."""
    with _ENGINES_LOCK:
        loaded = _ENGINES.get(pair["pair_digest"])
        if loaded is None:
            from registry.policy import measurement_settings
            from runner import MeasureSettings
            from runner.build import build_engine

            settings = measurement_settings(pair["config"], {"temperature": 0.0})
            try:
                built = build_engine(
                    MeasureSettings(**settings), pair["target_dir"], pair["drafter_dir"]
                )
            except ValueError as exc:
                raise InvalidInput(f"cannot serve this pair: {exc}", field="model") from exc
            loaded = _Loaded(built.tokenizer, built.engine, threading.Lock())
            _ENGINES[pair["pair_digest"]] = loaded
        return loaded


def _live_pair(db_url: str, deployment: str) -> dict[str, Any]:
    with session_scope(db_url) as session:
        dep = req_svc._deployment(session, deployment, field="model")
        if dep.current_pair_id is None:
            raise InvalidInput(f"deployment {deployment} has no live pair", field="model")
        pair = session.get(Pair, dep.current_pair_id)
        assert pair is not None
        target_dir = pair.target.local_path
        drafter_dir = pair.drafter.local_path if pair.drafter else None
        if not target_dir or (pair.drafter is not None and not drafter_dir):
            raise InvalidInput(
                f"pair {pair.pair_digest[:12]} has no local copy of its weights to serve",
                field="model",
            )
        return {
            "pair_digest": pair.pair_digest,
            "method": pair.method,
            "k": pair.k,
            "config": dict(pair.config),
            "target_dir": target_dir,
            "drafter_dir": drafter_dir,
        }


def _histogram(run: Any) -> list[int]:
    """Steps that accepted exactly 0..k drafts, from per-position acceptance counts."""
    apos = list(run.accepted_per_position)
    if not apos:
        return []
    counts = [run.steps - apos[0]]
    counts += [apos[i] - apos[i + 1] for i in range(len(apos) - 1)]
    counts.append(apos[-1])
    return counts


def _generate(loaded: _Loaded, prompt: str, max_tokens: int) -> tuple[str, list[int], int, Any]:
    from runner.measure import encode_prompt

    ids = encode_prompt(loaded.tokenizer, prompt)
    with loaded.lock:
        run = loaded.engine.generate(ids, max_new_tokens=max_tokens)
    text = loaded.tokenizer.decode(run.output_ids, skip_special_tokens=True)
    return text, list(run.output_ids), len(ids), run


def _tag(db_url: str, actor: str, request_id: str, deployment: str, pair: dict[str, Any],
         served_at: Any, n_in: int, n_out: int, spec: dict[str, Any]) -> None:  # fmt: skip
    tag = {"request_id": request_id, "deployment": deployment,
           "pair_digest": pair["pair_digest"], "served_at": served_at,
           "input_tokens": n_in, "output_tokens": n_out, "spec": spec}  # fmt: skip
    with session_scope(db_url) as session:
        req_svc.ingest_requests(session, tags=[tag], actor=actor)


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
        )  # noqa: E501
    request_id = request.headers.get("x-request-id") or f"cmpl-{uuid.uuid4().hex}"
    served_at = utcnow()
    pair = _live_pair(request.app.state.db_url, body.model)
    loaded = _engine(pair)
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts:
        raise InvalidInput("prompt must not be empty", field="prompt")
    choices, prompt_tokens, completion_tokens = [], 0, 0
    steps = drafted = accepted = 0
    hist: list[int] = []
    for index, prompt in enumerate(prompts):
        text, out_ids, n_in, run = _generate(loaded, prompt, body.max_tokens)
        finish = "length" if len(out_ids) >= body.max_tokens else "stop"
        choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish})
        prompt_tokens += n_in
        completion_tokens += len(out_ids)
        steps, drafted, accepted = steps + run.steps, drafted + run.drafted, accepted + run.accepted
        h = _histogram(run)
        hist = [a + b for a, b in zip(hist, h, strict=True)] if hist else h
    spec = {
        "num_spec_steps": steps,
        "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": accepted,
        "acceptance_histogram": hist or None,
    }
    # Always tagged here, whoever calls; the x-pairreg-pair-digest response header tells a
    # `pairreg proxy` in front that this request is already recorded.
    _tag(request.app.state.db_url, principal.actor, request_id, body.model, pair,
         served_at, prompt_tokens, completion_tokens, spec)  # fmt: skip
    headers = {"x-request-id": request_id, "x-pairreg-pair-digest": pair["pair_digest"]}
    created = int(time.time())
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if not body.stream:
        return JSONResponse(
            {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": body.model,
                "choices": choices,
                "usage": usage,
                "metrics": {"speculative_decoding": spec},
            },
            headers=headers,
        )
    include_usage = bool((body.stream_options or {}).get("include_usage"))

    def events() -> Iterator[str]:
        base = {"id": request_id, "object": "text_completion", "created": created,
                "model": body.model}  # fmt: skip
        for c in choices:
            text = c["text"]
            for start in range(0, len(text), 8):
                piece = {"index": c["index"], "text": text[start : start + 8],
                         "logprobs": None, "finish_reason": None}  # fmt: skip
                yield f"data: {json.dumps({**base, 'choices': [piece]})}\n\n"
            last = {"index": c["index"], "text": "", "logprobs": None,
                    "finish_reason": c["finish_reason"]}  # fmt: skip
            yield f"data: {json.dumps({**base, 'choices': [last]})}\n\n"
        if include_usage:
            final = {**base, "choices": [], "usage": usage,
                     "metrics": {"speculative_decoding": spec}}  # fmt: skip
            yield f"data: {json.dumps(final)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
