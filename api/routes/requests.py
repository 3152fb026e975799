"""``/v1/requests``, ``/v1/telemetry``, ``/v1/exports``: request tags, audits, bundles, telemetry.

The embedded ``/v1/completions`` server lives in :mod:`api.routes.completions` and is
included here, so this module is the area's one entry in ``api.routes.ROUTERS``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from api.auth import INGEST, READ_AUDIT, READ_REGISTRY, Principal, require
from api.deps import call
from api.params import Limit, Timestamp
from registry.records_requests import (
    MAX_BATCH,
    ExportResult,
    IngestResult,
    RequestAudit,
    RequestPage,
    TagIn,
    TelemetryResult,
)
from registry.services import bundles as bundle_svc
from registry.services import exports as export_svc
from registry.services import requests as svc
from registry.services import telemetry as telemetry_svc

router = APIRouter(tags=["requests"])

RequestCursor = Annotated[
    str | None,
    Query(
        max_length=600,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="`next_cursor` from the previous page; omit for the first page.",
    ),
]


class IngestRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"tags": [TagIn.model_json_schema()["example"]]}]},
    )

    tags: list[TagIn] = Field(max_length=MAX_BATCH, description=f"At most {MAX_BATCH} tags.")


@router.post(
    "/v1/requests",
    response_model=IngestResult,
    status_code=201,
    responses={200: {"model": IngestResult, "description": "Nothing new: every tag existed"}},
    summary="Ingest a batch of request tags (idempotent by request id)",
)
def ingest(
    body: IngestRequest,
    request: Request,
    response: Response,
    principal: Principal = Depends(require(INGEST)),
) -> IngestResult:
    result = call(request, principal, svc.ingest_requests, tags=body.tags)
    if result.stored == 0:
        response.status_code = 200
    return result


@router.get("/v1/requests", response_model=RequestPage, summary="List request tags")
def list_requests(
    request: Request,
    pair: str | None = Query(None, description="Pair id or digest prefix."),
    deployment: str | None = None,
    since: Timestamp = None,
    until: Timestamp = None,
    inconsistent: bool | None = Query(
        None, description="true: only tags whose pair was not live on the deployment then."
    ),
    cursor: RequestCursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_AUDIT)),
) -> RequestPage:
    return call(
        request,
        principal,
        svc.list_requests,
        pair=pair,
        deployment=deployment,
        since=since,
        until=until,
        inconsistent=inconsistent,
        cursor=cursor,
        limit=limit,
    )


@router.get(
    "/v1/requests/{request_id}",
    response_model=RequestAudit,
    summary="Which pair served this request, with everything needed to reconstruct it",
)
def audit_request(
    request_id: str, request: Request, principal: Principal = Depends(require(READ_AUDIT))
) -> RequestAudit:
    return call(request, principal, svc.audit_request, request_id=request_id)


@router.get(
    "/v1/requests/{request_id}/bundle",
    summary="A self-contained, offline-verifiable audit bundle for one request",
)
def bundle(
    request_id: str, request: Request, principal: Principal = Depends(require(READ_AUDIT))
) -> dict[str, Any]:
    return call(request, principal, bundle_svc.build_bundle, request_id=request_id)


@router.post(
    "/v1/telemetry/prometheus",
    response_model=TelemetryResult,
    summary="Push a Prometheus scrape of a serving engine (vLLM spec-decode counters)",
)
def telemetry(
    request: Request,
    deployment: str = Query(..., description="The deployment the scraped engine serves."),
    source: str = Query("push", max_length=500, description="Where the text came from."),
    min_drafted: int = Query(1000, ge=1, description="Draft tokens needed before flagging."),
    text: str = Body(..., media_type="text/plain", description="Prometheus text exposition."),
    principal: Principal = Depends(require(INGEST)),
) -> TelemetryResult:
    return call(
        request,
        principal,
        telemetry_svc.ingest_prometheus,
        deployment=deployment,
        text=text,
        source=source,
        min_drafted=min_drafted,
    )


@router.get(
    "/v1/exports/{engine}",
    response_model=ExportResult,
    summary="Serving-engine launch arguments for a deployment's live pair",
)
def export(
    engine: Literal["vllm", "sglang"],
    request: Request,
    deployment: str = Query(...),
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> ExportResult:
    return call(request, principal, export_svc.export_serving, deployment=deployment, engine=engine)


def _include_completions() -> None:
    try:
        from api.routes.completions import router as completions_router
    except ModuleNotFoundError as exc:
        if exc.name != "api.routes.completions":
            raise
        return
    router.include_router(completions_router)


_include_completions()
