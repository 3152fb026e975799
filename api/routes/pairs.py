"""``/v1/pairs``: thin routes over ``registry.services.pairs``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.auth import READ_REGISTRY, WRITE_REGISTRY, Principal, require
from api.deps import call
from api.params import Cursor, Limit
from registry.records import Method, Page, PairRecord, PairRegisterResult, PairStatus
from registry.services import pairs as svc

router = APIRouter(prefix="/v1/pairs", tags=["pairs"])


class PairRegisterRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "target": "acme/chat-8b@v1",
                    "draft": "acme/chat-draft@latest",
                    "method": "draft_model",
                    "k": 4,
                    "options": {"acceptance": "strict"},
                }
            ]
        },
    )

    target: str = Field(min_length=1, description="Target artifact reference.")
    draft: str | None = Field(default=None, description="Drafter artifact reference.")
    method: Method
    k: int = Field(ge=1, le=64, description="num_speculative_tokens")
    options: dict[str, Any] = Field(default_factory=dict, description="Config keys (see README).")
    strict: bool = Field(default=False, description="Compatibility warnings become errors.")


@router.post(
    "",
    response_model=PairRegisterResult,
    status_code=201,
    responses={200: {"model": PairRegisterResult, "description": "Pair existed"}},
    summary="Register a pair (idempotent by digest)",
)
def register_pair(
    body: PairRegisterRequest,
    request: Request,
    response: Response,
    principal: Principal = Depends(require(WRITE_REGISTRY)),
) -> PairRegisterResult:
    result = call(
        request,
        principal,
        svc.register_pair,
        target=body.target,
        draft=body.draft,
        method=body.method,
        k=body.k,
        options=body.options,
        strict=body.strict,
    )
    if not result.created:
        response.status_code = 200
    return result


@router.get("", response_model=Page[PairRecord], summary="List pairs")
def list_pairs(
    request: Request,
    target: str | None = None,
    status: PairStatus | None = None,
    method: Method | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[PairRecord]:
    return call(
        request,
        principal,
        svc.list_pairs,
        target=target,
        status=status,
        method=method,
        cursor=cursor,
        limit=limit,
    )


@router.get("/{ref}", response_model=PairRecord, summary="One pair")
def get_pair(
    ref: str, request: Request, principal: Principal = Depends(require(READ_REGISTRY))
) -> PairRecord:
    return call(request, principal, svc.get_pair, ref=ref)
