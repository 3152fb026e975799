"""Measurements, jobs (the worker protocol), drift flags and the Hub watch, over HTTP."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from api.auth import GOVERN, READ_REGISTRY, Principal, require
from api.deps import call
from api.params import Cursor, Limit
from registry.records import Page
from registry.records_governance import (
    DriftCheckResult,
    DriftFlagRecord,
    JobRecord,
    MeasurementRecord,
    WatchResult,
)
from registry.services import drift as drift_svc
from registry.services import jobs as job_svc
from registry.services import measurements as m_svc
from registry.services import watch as watch_svc

# Workers and the measure command write measurements and drive jobs.
WORKERS = frozenset({"admin", "registrar", "promoter"})

router = APIRouter()


class MeasurementStoreRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "pair": "3f2a9c1b7d4e",
                    "suite_name": "default",
                    "suite_digest": "ab" * 32,
                    "settings": {"method": "draft_model", "k": 4, "temperature": 0.0},
                    "runner_version": "0.1.0",
                    "result": {"categories": {}, "overall": {}, "prompts": []},
                }
            ]
        },
    )
    pair: str = Field(min_length=1)
    suite_name: str = Field(min_length=1, max_length=200)
    suite_digest: str = Field(min_length=1, max_length=64)
    settings: dict[str, Any]
    runner_version: str = Field(min_length=1, max_length=64)
    result: dict[str, Any]
    mlflow_run_id: str | None = Field(default=None, max_length=64)
    device: str | None = Field(default=None, max_length=64)


@router.post(
    "/v1/measurements",
    response_model=MeasurementRecord,
    status_code=201,
    summary="Store a measurement taken by `pairreg measure`",
    tags=["measurements"],
)
def store_measurement(
    body: MeasurementStoreRequest,
    request: Request,
    principal: Principal = Depends(require(WORKERS)),
) -> MeasurementRecord:
    return call(request, principal, m_svc.store_measurement, **body.model_dump())


@router.get(
    "/v1/measurements",
    response_model=Page[MeasurementRecord],
    summary="List measurements (without per-prompt rows)",
    tags=["measurements"],
)
def list_measurements(
    request: Request,
    pair: str | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[MeasurementRecord]:
    return call(request, principal, m_svc.list_measurements, pair=pair, cursor=cursor, limit=limit)


@router.get(
    "/v1/measurements/{id}",
    response_model=MeasurementRecord,
    summary="A measurement with its per-prompt counters",
    tags=["measurements"],
)
def get_measurement(
    id: int,
    request: Request,
    prompts: bool = True,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> MeasurementRecord:
    return call(request, principal, m_svc.get_measurement, id=id, prompts=prompts)


# --- jobs --------------------------------------------------------------------------------


class ClaimRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"worker": "gpu-box-1:4242", "device": "cuda", "lease_seconds": 60}]
        },
    )
    worker: str = Field(min_length=1, max_length=200)
    device: Literal["cpu", "cuda"] | None = None
    kinds: list[str] | None = None
    lease_seconds: int = Field(default=60, ge=1, le=3600)
    id: int | None = Field(default=None, description="Claim this job only.")


class RenewRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"worker": "gpu-box-1:4242", "lease_seconds": 60}]},
    )
    worker: str = Field(min_length=1, max_length=200)
    lease_seconds: int = Field(default=60, ge=1, le=3600)


class CompleteRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "worker": "gpu-box-1:4242",
                    "result": {"suite_digest": "ab" * 32, "runner_version": "0.1.0", "result": {}},
                }
            ]
        },
    )
    worker: str = Field(min_length=1, max_length=200)
    result: dict[str, Any]


class FailRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"worker": "gpu-box-1:4242", "error": "CUDA out of memory", "retry": True}]
        },
    )
    worker: str = Field(min_length=1, max_length=200)
    error: str = Field(min_length=1, max_length=20_000)
    retry: bool = True


@router.get("/v1/jobs", response_model=Page[JobRecord], summary="List jobs", tags=["jobs"])
def list_jobs(
    request: Request,
    state: str | None = None,
    kind: str | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[JobRecord]:
    return call(
        request, principal, job_svc.list_jobs, state=state, kind=kind, cursor=cursor, limit=limit
    )


@router.get("/v1/jobs/{id}", response_model=JobRecord, summary="Show a job", tags=["jobs"])
def get_job(
    id: int, request: Request, principal: Principal = Depends(require(READ_REGISTRY))
) -> JobRecord:
    return call(request, principal, job_svc.get_job, id=id)


@router.post(
    "/v1/jobs/claim",
    response_model=JobRecord | None,
    summary="Claim the oldest claimable job (null when none)",
    tags=["jobs"],
)
def claim_job(
    body: ClaimRequest, request: Request, principal: Principal = Depends(require(WORKERS))
) -> JobRecord | None:
    return call(
        request,
        principal,
        job_svc.claim_job,
        worker=body.worker,
        device=body.device,
        kinds=body.kinds,
        lease_seconds=body.lease_seconds,
        id=body.id,
    )


@router.post(
    "/v1/jobs/{id}/renew", response_model=JobRecord, summary="Renew a job's lease", tags=["jobs"]
)
def renew_lease(
    id: int, body: RenewRequest, request: Request, principal: Principal = Depends(require(WORKERS))
) -> JobRecord:
    return call(
        request,
        principal,
        job_svc.renew_lease,
        id=id,
        worker=body.worker,
        lease_seconds=body.lease_seconds,
    )


@router.post(
    "/v1/jobs/{id}/complete",
    response_model=JobRecord,
    summary="Hand back a job's results (written once)",
    tags=["jobs"],
)
def complete_job(
    id: int,
    body: CompleteRequest,
    request: Request,
    principal: Principal = Depends(require(WORKERS)),
) -> JobRecord:
    return call(
        request, principal, job_svc.complete_job, id=id, worker=body.worker, result=body.result
    )


@router.post(
    "/v1/jobs/{id}/fail", response_model=JobRecord, summary="Record a failed attempt", tags=["jobs"]
)
def fail_job(
    id: int, body: FailRequest, request: Request, principal: Principal = Depends(require(WORKERS))
) -> JobRecord:
    return call(
        request,
        principal,
        job_svc.fail_job,
        id=id,
        worker=body.worker,
        error=body.error,
        retry=body.retry,
    )


# --- drift ---------------------------------------------------------------------------


class ReasonRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"reason": "expected: v2 was tuned for prose; code traffic is small"}]
        },
    )
    reason: str = Field(min_length=1, max_length=2000)


class DriftCheckRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "candidate": "3f2a9c1b7d4e",
                    "baseline_measurement": 1,
                    "candidate_measurement": 2,
                    "policy": "default",
                }
            ]
        },
    )
    candidate: str = Field(min_length=1)
    baseline_measurement: int = Field(ge=1)
    candidate_measurement: int = Field(ge=1)
    policy: str = "default"


@router.get("/v1/drift", response_model=Page[DriftFlagRecord], summary="List flags", tags=["drift"])
def list_flags(
    request: Request,
    state: str | None = None,
    kind: str | None = None,
    pair: str | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[DriftFlagRecord]:
    return call(
        request,
        principal,
        drift_svc.list_flags,
        state=state,
        kind=kind,
        pair=pair,
        cursor=cursor,
        limit=limit,
    )


@router.get("/v1/drift/{id}", response_model=DriftFlagRecord, summary="Show a flag", tags=["drift"])
def get_flag(
    id: int, request: Request, principal: Principal = Depends(require(READ_REGISTRY))
) -> DriftFlagRecord:
    return call(request, principal, drift_svc.get_flag, id=id)


@router.post(
    "/v1/drift/{id}/ack",
    response_model=DriftFlagRecord,
    summary="Acknowledge a flag with a reason (unblocks promotion)",
    tags=["drift"],
)
def ack_flag(
    id: int, body: ReasonRequest, request: Request, principal: Principal = Depends(require(GOVERN))
) -> DriftFlagRecord:
    return call(request, principal, drift_svc.ack_flag, id=id, reason=body.reason)


@router.post(
    "/v1/drift/{id}/resolve",
    response_model=DriftFlagRecord,
    summary="Resolve a flag",
    tags=["drift"],
)
def resolve_flag(
    id: int, body: ReasonRequest, request: Request, principal: Principal = Depends(require(GOVERN))
) -> DriftFlagRecord:
    return call(request, principal, drift_svc.resolve_flag, id=id, reason=body.reason)


@router.post(
    "/v1/drift/check",
    response_model=DriftCheckResult,
    summary="Compare two stored measurements for drift",
    tags=["drift"],
)
def check_drift(
    body: DriftCheckRequest, request: Request, principal: Principal = Depends(require(GOVERN))
) -> DriftCheckResult:
    return call(request, principal, drift_svc.check_drift, **body.model_dump())


class WatchRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"lineage": "acme/chat-8b"}]}
    )
    lineage: str | None = None


@router.post(
    "/v1/watch",
    response_model=list[WatchResult],
    summary="Poll watched Hub branches once",
    tags=["drift"],
)
def watch(
    body: WatchRequest, request: Request, principal: Principal = Depends(require(WORKERS))
) -> list[WatchResult]:
    return call(request, principal, watch_svc.watch, lineage=body.lineage)
