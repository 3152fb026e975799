"""``/v1/tokens`` (admin only)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from api.auth import ADMIN, Principal, require
from api.deps import call
from api.params import Cursor, Limit
from registry.records import Page, TokenCreated, TokenRecord
from registry.services import tokens as svc
from registry.services.tokens import TOKEN_NAME_PATTERN

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


class TokenCreateRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "ci-ingest", "role": "ingest"}]}
    )
    name: str = Field(
        pattern=TOKEN_NAME_PATTERN,
        description="Unique; letters, digits, '.', '_' or '-', starting with a letter or digit.",
    )
    role: Literal["admin", "registrar", "promoter", "ingest", "auditor", "reader"]


@router.post("", response_model=TokenCreated, status_code=201, summary="Create a token")
def create_token(
    body: TokenCreateRequest, request: Request, principal: Principal = Depends(require(ADMIN))
) -> TokenCreated:
    return call(request, principal, svc.create_token, name=body.name, role=body.role)


@router.get("", response_model=Page[TokenRecord], summary="List tokens")
def list_tokens(
    request: Request,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(ADMIN)),
) -> Page[TokenRecord]:
    return call(request, principal, svc.list_tokens, cursor=cursor, limit=limit)


@router.delete("/{name}", response_model=TokenRecord, summary="Revoke a token")
def revoke_token(
    name: str, request: Request, principal: Principal = Depends(require(ADMIN))
) -> TokenRecord:
    return call(request, principal, svc.revoke_token, name=name)
