"""``/v1/audit``: events, chain verification and signed checkpoints."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from api.auth import READ_AUDIT, Principal, require
from api.deps import call
from api.params import Cursor, Limit, Timestamp
from registry.records import AuditEventRecord, ChainVerifyResult, Page
from registry.services import audit_log as svc

router = APIRouter(prefix="/v1/audit", tags=["audit"])


class Checkpoint(BaseModel):
    """A signed head: ``{seq, chain_hash, signed_at}`` signed with Ed25519."""

    model_config = ConfigDict(extra="allow")

    seq: int = Field(ge=0)
    chain_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    signed_at: str = Field(
        pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$",
        examples=["2025-01-31T12:00:00.000000Z"],
    )
    signature: str = Field(pattern=r"^[A-Za-z0-9+/]{86}==$", description="Base64 Ed25519.")
    public_key: str = Field(
        pattern=r"^-----BEGIN PUBLIC KEY-----\n[A-Za-z0-9+/=\n]+-----END PUBLIC KEY-----\n?$",
        description="PEM SubjectPublicKeyInfo of the signing key.",
    )
    algorithm: Literal["ed25519"] = "ed25519"


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: Checkpoint | None = None


@router.get("/events", response_model=Page[AuditEventRecord], summary="List audit events")
def list_events(
    request: Request,
    entity_type: str | None = None,
    entity_id: str | None = None,
    actor: str | None = None,
    action: str | None = None,
    since: Timestamp = None,
    until: Timestamp = None,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_AUDIT)),
) -> Page[AuditEventRecord]:
    return call(
        request,
        principal,
        svc.list_audit_events,
        entity_type=entity_type,
        entity_id=entity_id,
        by_actor=actor,
        action=action,
        since=since,
        until=until,
        cursor=cursor,
        limit=limit,
    )


@router.get("/verify", response_model=ChainVerifyResult, summary="Recompute the hash chain")
def verify(
    request: Request, principal: Principal = Depends(require(READ_AUDIT))
) -> ChainVerifyResult:
    return call(request, principal, svc.verify_audit_chain)


@router.post(
    "/verify", response_model=ChainVerifyResult, summary="Verify the chain against a checkpoint"
)
def verify_against(
    body: VerifyRequest, request: Request, principal: Principal = Depends(require(READ_AUDIT))
) -> ChainVerifyResult:
    checkpoint = body.checkpoint.model_dump() if body.checkpoint else None
    return call(request, principal, svc.verify_audit_chain, checkpoint=checkpoint)


@router.post("/checkpoint", response_model=Checkpoint, summary="Sign the current head")
def checkpoint(
    request: Request, principal: Principal = Depends(require(READ_AUDIT))
) -> dict[str, Any]:
    # The server's own key, not whatever PAIRREG_HOME the process environment names.
    key_path = str(request.app.state.settings.signing_key_path)
    return call(request, principal, svc.create_audit_checkpoint, key_path=key_path)
