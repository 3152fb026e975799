"""Embedded serving's routes: OpenAI-compatible ``/v1/completions`` and
``/v1/chat/completions`` for a deployment's live pair. Thin on purpose: each validates its
request into a :class:`api.serving.Job` and hands it to :func:`api.serving.serve`
(generate → tag → respond, real token-by-token streaming), where the module docstring
says how."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from api import serving
from api.auth import Principal, require_in_read_lane
from api.serving import ChatCompletionRequest, CompletionRequest
from registry.governance.roles import INGEST

router = APIRouter(tags=["serving"])


@router.post(
    "/v1/completions",
    summary="OpenAI-compatible completions served by the deployment's live pair (tagged)",
)
async def completions(
    body: CompletionRequest,
    request: Request,
    principal: Principal = Depends(require_in_read_lane(INGEST)),
) -> Any:
    return await serving.serve(serving.completion_job(body, request), request, principal)


@router.post(
    "/v1/chat/completions",
    summary="OpenAI-compatible chat completions served by the deployment's live pair, "
    "rendered with the target's chat template (tagged)",
)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    principal: Principal = Depends(require_in_read_lane(INGEST)),
) -> Any:
    return await serving.serve(serving.chat_job(body, request), request, principal)
