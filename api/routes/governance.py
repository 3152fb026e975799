"""Governance routes: policies, validation, deployments, measurements, jobs, drift, watch.

Thin wrappers over the governance services; each route runs one service in one
transaction with the caller as actor. Sub-routers live in ``governance_ops`` (jobs,
measurements, drift, watch) to keep modules small.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from api.auth import GOVERN, READ_REGISTRY, Principal, require
from api.deps import call
from api.params import Cursor, Limit, _iso_text_only
from api.routes.governance_ops import router as ops_router
from registry.records import Page
from registry.records_governance import (
    DeploymentEventRecord,
    DeploymentRecord,
    PolicyPutResult,
    PolicyRecord,
    PromoteResult,
    ValidateResult,
    ValidationRecord,
)
from registry.services import deployments as dep_svc
from registry.services import policies as pol_svc
from registry.services import validation as val_svc

VALIDATORS = frozenset({"admin", "registrar", "promoter"})

router = APIRouter(tags=["governance"])
router.include_router(ops_router)


class PolicyPutRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"text": 'name = "strict"\n[alpha]\nmin_overall = 0.6\n'}]},
    )
    text: str = Field(min_length=1, max_length=100_000, description="Policy TOML.")
    name: str | None = Field(default=None, description="Store under this name instead.")


@router.post(
    "/v1/policies",
    response_model=PolicyPutResult,
    status_code=201,
    responses={200: {"model": PolicyPutResult, "description": "Unchanged"}},
    summary="Store a policy (new version when changed)",
    tags=["policies"],
)
def put_policy(
    body: PolicyPutRequest,
    request: Request,
    response: Response,
    principal: Principal = Depends(require(GOVERN)),
) -> PolicyPutResult:
    res = call(request, principal, pol_svc.put_policy, text=body.text, name=body.name)
    if not res.created:
        response.status_code = 200
    return res


@router.get(
    "/v1/policies", response_model=Page[PolicyRecord], summary="List policies", tags=["policies"]
)
def list_policies(
    request: Request,
    name: str | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[PolicyRecord]:
    return call(request, principal, pol_svc.list_policies, name=name, cursor=cursor, limit=limit)


@router.get(
    "/v1/policies/{name}", response_model=PolicyRecord, summary="Show a policy", tags=["policies"]
)
def get_policy(
    name: str,
    request: Request,
    version: Annotated[int | None, Query(ge=1)] = None,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> PolicyRecord:
    return call(request, principal, pol_svc.get_policy, name=name, version=version)


# --- validation ------------------------------------------------------------------------


class ValidateRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"policy": "default", "deployment": "chat-prod"}]},
    )
    policy: str | None = Field(
        default=None, description="Policy name (default: the deployment's, else `default`)."
    )
    policy_text: str | None = Field(
        default=None, max_length=100_000, description="A policy TOML to store and use."
    )
    deployment: str | None = None
    device: str | None = Field(
        default=None,
        pattern="^(cpu|cuda)$",
        description="Only a worker on this device may measure.",
    )


@lru_cache(maxsize=32)
def _runner_identity(
    suite: str, categories: tuple[str, ...], per_category: int
) -> tuple[str | None, str | None]:
    """The server-side runner's version and suite digest, when the runner is installed."""
    try:
        from cli.measure import select_prompts
        from runner import RUNNER_VERSION, load_suite, suite_digest
    except ImportError:
        return None, None
    try:
        prompts = select_prompts(load_suite(suite), list(categories) or None, per_category)
    except Exception:  # noqa: BLE001 - an unknown suite is reported by the measuring worker
        return RUNNER_VERSION, None
    return RUNNER_VERSION, suite_digest(prompts)


@router.post(
    "/v1/pairs/{ref}/validate",
    response_model=ValidateResult,
    responses={202: {"model": ValidateResult, "description": "Measurement queued"}},
    summary="Validate a pair against a policy",
    tags=["validation"],
)
def validate_pair(
    ref: str,
    body: ValidateRequest,
    request: Request,
    response: Response,
    principal: Principal = Depends(require(VALIDATORS)),
) -> ValidateResult:
    from registry.db import session_scope
    from registry.policy import parse_policy

    if body.policy_text is not None:
        parsed = parse_policy(body.policy_text)
    else:
        name = body.policy
        with session_scope(request.app.state.db_url) as s:
            if name is None and body.deployment:
                name = dep_svc.find_deployment(s, body.deployment).policy_name
            parsed = pol_svc.load_policy(s, name or "default", actor=principal.actor).parsed
    suite = parsed["suite"]
    version, digest = _runner_identity(
        suite["name"], tuple(suite["categories"]), suite["prompts_per_category"]
    )
    res = call(
        request,
        principal,
        val_svc.validate_pair,
        ref=ref,
        policy=body.policy,
        policy_text=body.policy_text,
        deployment=body.deployment,
        runner_version=version,
        suite_digest=digest,
        device=body.device,
    )
    if res.state == "queued":
        response.status_code = 202
    return res


@router.get(
    "/v1/validations",
    response_model=Page[ValidationRecord],
    summary="List validations",
    tags=["validation"],
)
def list_validations(
    request: Request,
    pair: str | None = None,
    policy: str | None = None,
    without_mlflow_run: bool = Query(False, description="Only validations with no MLflow run."),
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[ValidationRecord]:
    return call(
        request,
        principal,
        val_svc.list_validations,
        pair=pair,
        policy=policy,
        without_mlflow_run=without_mlflow_run,
        cursor=cursor,
        limit=limit,
    )


@router.get(
    "/v1/validations/{id}",
    response_model=ValidationRecord,
    summary="Show a validation and its gates",
    tags=["validation"],
)
def get_validation(
    id: int, request: Request, principal: Principal = Depends(require(READ_REGISTRY))
) -> ValidationRecord:
    return call(request, principal, val_svc.get_validation, id=id)


class MlflowRunRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"mlflow_run_id": "a1b2c3"}]}
    )
    mlflow_run_id: str = Field(min_length=1, max_length=64)


@router.post(
    "/v1/validations/{id}/mlflow-run",
    response_model=ValidationRecord,
    summary="Attach the MLflow run logged for a validation",
    tags=["validation"],
)
def set_validation_run(
    id: int,
    body: MlflowRunRequest,
    request: Request,
    principal: Principal = Depends(require(VALIDATORS)),
) -> ValidationRecord:
    return call(
        request, principal, val_svc.set_validation_run, id=id, mlflow_run_id=body.mlflow_run_id
    )


# --- deployments -----------------------------------------------------------------------


class DeploymentCreateRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"name": "chat-prod", "policy": "default"}]},
    )
    name: str = Field(min_length=1, max_length=100)
    policy: str = Field(default="default", min_length=1, max_length=100)


class PromoteRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [{"pair": "3f2a9c1b7d4e", "reason": "passed canary", "expect_version": 4}]
        },
    )
    pair: str = Field(min_length=1, description="Pair id or digest prefix.")
    reason: str = Field(min_length=1, max_length=2000)
    create: bool = Field(default=False, description="Create the deployment if missing.")
    expect_version: int | None = Field(
        default=None, ge=0, description="Refuse if the deployment moved past it."
    )


class RollbackRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"reason": "acceptance fell in production"}]},
    )
    reason: str = Field(min_length=1, max_length=2000)
    expect_version: int | None = Field(default=None, ge=0)


class DeploymentPolicyRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"policy": "strict"}]}
    )
    policy: str = Field(min_length=1, max_length=100)


@router.post(
    "/v1/deployments",
    response_model=DeploymentRecord,
    status_code=201,
    summary="Create a deployment",
    tags=["deployments"],
)
def create_deployment(
    body: DeploymentCreateRequest, request: Request, principal: Principal = Depends(require(GOVERN))
) -> DeploymentRecord:
    return call(request, principal, dep_svc.create_deployment, name=body.name, policy=body.policy)


@router.get(
    "/v1/deployments",
    response_model=Page[DeploymentRecord],
    summary="List deployments",
    tags=["deployments"],
)
def list_deployments(
    request: Request,
    cursor: Cursor = None,
    limit: Limit = 100,
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> Page[DeploymentRecord]:
    return call(request, principal, dep_svc.list_deployments, cursor=cursor, limit=limit)


@router.get(
    "/v1/deployments/{name}",
    response_model=DeploymentRecord,
    summary="A deployment, its live pair and full history",
    tags=["deployments"],
)
def get_deployment(
    name: str, request: Request, principal: Principal = Depends(require(READ_REGISTRY))
) -> DeploymentRecord:
    return call(request, principal, dep_svc.get_deployment, name=name)


@router.get(
    "/v1/deployments/{name}/at",
    response_model=DeploymentEventRecord | None,
    summary="The move in force at a time (which pair served it)",
    tags=["deployments"],
)
def deployment_at(
    name: str,
    request: Request,
    time: Annotated[
        AwareDatetime,
        BeforeValidator(_iso_text_only),
        Query(description="ISO-8601 date-time with a timezone."),
    ],
    principal: Principal = Depends(require(READ_REGISTRY)),
) -> DeploymentEventRecord | None:
    when: datetime = time
    return call(request, principal, dep_svc.deployment_at, name=name, at=when)


@router.post(
    "/v1/deployments/{name}/promote",
    response_model=PromoteResult,
    summary="Promote a pair (gates re-checked in the transaction)",
    tags=["deployments"],
)
def promote(
    name: str,
    body: PromoteRequest,
    request: Request,
    principal: Principal = Depends(require(GOVERN)),
) -> PromoteResult:
    return call(
        request,
        principal,
        dep_svc.promote,
        ref=body.pair,
        deployment=name,
        reason=body.reason,
        create=body.create,
        expect_version=body.expect_version,
    )


@router.post(
    "/v1/deployments/{name}/rollback",
    response_model=PromoteResult,
    summary="Return to the previous pair",
    tags=["deployments"],
)
def rollback(
    name: str,
    body: RollbackRequest,
    request: Request,
    principal: Principal = Depends(require(GOVERN)),
) -> PromoteResult:
    return call(
        request,
        principal,
        dep_svc.rollback,
        deployment=name,
        reason=body.reason,
        expect_version=body.expect_version,
    )


@router.put(
    "/v1/deployments/{name}/policy",
    response_model=DeploymentRecord,
    summary="Change the policy a deployment enforces",
    tags=["deployments"],
)
def set_deployment_policy(
    name: str,
    body: DeploymentPolicyRequest,
    request: Request,
    principal: Principal = Depends(require(GOVERN)),
) -> DeploymentRecord:
    return call(request, principal, dep_svc.set_deployment_policy, name=name, policy=body.policy)
