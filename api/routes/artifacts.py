"""``/v1/artifacts``: thin routes over ``registry.services.artifacts``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.auth import READ_REGISTRY, VERIFY_ARTIFACT, WRITE_REGISTRY, Principal, require
from api.deps import call
from api.params import Cursor, Limit
from registry.records import ArtifactAddResult, ArtifactRecord, Page, Provenance, Role, VerifyReport
from registry.services import artifacts as svc

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


class ArtifactAddRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "source": "hf://acme/chat-8b@main",
                    "name": "acme/chat-8b",
                    "role": "target",
                    "provenance": {"publisher": "acme", "license": "apache-2.0"},
                }
            ]
        },
    )

    source: str = Field(min_length=1, description="Server-local directory or hf://org/repo[@rev].")
    name: str = Field(min_length=1, max_length=200, description="Lineage name.")
    role: Role
    provenance: Provenance = Field(default_factory=Provenance)


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(default=None, description="Directory to check; default its source.")


@router.post(
    "",
    response_model=ArtifactAddResult,
    status_code=201,
    responses={200: {"model": ArtifactAddResult, "description": "Identical content existed"}},
    summary="Register an artifact (idempotent by content)",
)
def add_artifact(
    body: ArtifactAddRequest,
    request: Request,
    response: Response,
    principal: Principal = Depends(require(WRITE_REGISTRY)),
) -> ArtifactAddResult:
    result = call(
        request,
        principal,
        svc.add_artifact,
        source=body.source,
        name=body.name,
        role=body.role,
        provenance=body.provenance,
    )
    if not result.created:
        response.status_code = 200
    return result


@router.get("", response_model=Page[ArtifactRecord], summary="List artifacts")
def list_artifacts(
    request: Request,
    lineage: str | None = None,
    role: Role | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[ArtifactRecord]:
    return call(
        request,
        principal,
        svc.list_artifacts,
        lineage=lineage,
        role=role,
        cursor=cursor,
        limit=limit,
    )


@router.post("/{ref:path}/verify", response_model=VerifyReport, summary="Re-hash and compare")
def verify_artifact(
    ref: str,
    request: Request,
    body: VerifyRequest | None = None,
    principal: Principal = Depends(require(VERIFY_ARTIFACT)),
) -> VerifyReport:
    return call(request, principal, svc.verify_artifact, ref=ref, path=body.path if body else None)


@router.get("/{ref:path}", response_model=ArtifactRecord, summary="One artifact with manifest")
def get_artifact(
    ref: str, request: Request, principal: Principal = Depends(require(READ_REGISTRY))
) -> ArtifactRecord:
    return call(request, principal, svc.get_artifact, ref=ref)
