"""Remote-client methods for governance: policies, validation, deployments, jobs, drift."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from pydantic import TypeAdapter

from api.client_base import ClientBase, _params, _ref
from registry.records import Page
from registry.records_governance import (
    DeploymentEventRecord,
    DeploymentRecord,
    DriftCheckResult,
    DriftFlagRecord,
    JobRecord,
    MeasurementRecord,
    PolicyPutResult,
    PolicyRecord,
    PromoteResult,
    ValidateResult,
    ValidationRecord,
    WatchResult,
)


class GovernanceClientMixin(ClientBase):
    """Methods mirror the service operations of the same names."""

    # -- policies -------------------------------------------------------------------------

    def put_policy(self, *, text: str, name: str | None = None) -> PolicyPutResult:
        return self._post(PolicyPutResult, "/v1/policies", {"text": text, "name": name})

    def get_policy(self, *, name: str, version: int | None = None) -> PolicyRecord:
        return self._get(PolicyRecord, f"/v1/policies/{quote(name, safe='')}", version=version)

    def list_policies(self, **params: Any) -> Page[PolicyRecord]:
        return self._get(Page[PolicyRecord], "/v1/policies", **params)

    # -- validation -----------------------------------------------------------------------

    def validate_pair(
        self,
        *,
        ref: str,
        policy: str | None = None,
        policy_text: str | None = None,
        deployment: str | None = None,
        runner_version: str | None = None,
        suite_digest: str | None = None,
        device: str | None = None,
    ) -> ValidateResult:
        # The server decides the runner version and suite digest its workers measure with.
        _ = (runner_version, suite_digest)
        body = {
            "policy": policy,
            "policy_text": policy_text,
            "deployment": deployment,
            "device": device,
        }
        return self._post(ValidateResult, f"/v1/pairs/{_ref(ref)}/validate", body)

    def get_validation(self, *, id: int) -> ValidationRecord:
        return self._get(ValidationRecord, f"/v1/validations/{id}")

    def list_validations(self, **params: Any) -> Page[ValidationRecord]:
        return self._get(Page[ValidationRecord], "/v1/validations", **params)

    def set_validation_run(self, *, id: int, mlflow_run_id: str) -> ValidationRecord:
        return self._post(
            ValidationRecord, f"/v1/validations/{id}/mlflow-run", {"mlflow_run_id": mlflow_run_id}
        )

    # -- deployments ----------------------------------------------------------------------

    def create_deployment(self, *, name: str, policy: str = "default") -> DeploymentRecord:
        return self._post(DeploymentRecord, "/v1/deployments", {"name": name, "policy": policy})

    def get_deployment(self, *, name: str) -> DeploymentRecord:
        return self._get(DeploymentRecord, f"/v1/deployments/{quote(name, safe='')}")

    def list_deployments(self, **params: Any) -> Page[DeploymentRecord]:
        return self._get(Page[DeploymentRecord], "/v1/deployments", **params)

    def deployment_at(self, *, name: str, at: datetime) -> DeploymentEventRecord | None:
        data = self.request(
            "GET", f"/v1/deployments/{quote(name, safe='')}/at", params=_params(time=at)
        )
        return None if data is None else DeploymentEventRecord.model_validate(data)

    def set_deployment_policy(self, *, name: str, policy: str) -> DeploymentRecord:
        return DeploymentRecord.model_validate(
            self.request(
                "PUT", f"/v1/deployments/{quote(name, safe='')}/policy", json={"policy": policy}
            )
        )

    def promote(
        self,
        *,
        ref: str,
        deployment: str,
        reason: str,
        create: bool = False,
        expect_version: int | None = None,
    ) -> PromoteResult:
        return self._post(
            PromoteResult,
            f"/v1/deployments/{quote(deployment, safe='')}/promote",
            {"pair": ref, "reason": reason, "create": create, "expect_version": expect_version},
        )

    def rollback(
        self, *, deployment: str, reason: str, expect_version: int | None = None
    ) -> PromoteResult:
        return self._post(
            PromoteResult,
            f"/v1/deployments/{quote(deployment, safe='')}/rollback",
            {"reason": reason, "expect_version": expect_version},
        )

    # -- measurements ---------------------------------------------------------------------

    def store_measurement(self, **body: Any) -> MeasurementRecord:
        return self._post(MeasurementRecord, "/v1/measurements", body)

    def get_measurement(self, *, id: int, prompts: bool = True) -> MeasurementRecord:
        return self._get(MeasurementRecord, f"/v1/measurements/{id}", prompts=prompts)

    def list_measurements(self, **params: Any) -> Page[MeasurementRecord]:
        return self._get(Page[MeasurementRecord], "/v1/measurements", **params)

    # -- jobs -----------------------------------------------------------------------------

    def claim_job(
        self,
        *,
        worker: str,
        device: str | None = None,
        kinds: list[str] | None = None,
        lease_seconds: int = 60,
        id: int | None = None,
    ) -> JobRecord | None:
        data = self.request(
            "POST",
            "/v1/jobs/claim",
            json={
                "worker": worker,
                "device": device,
                "kinds": kinds,
                "lease_seconds": lease_seconds,
                "id": id,
            },
        )
        return None if data is None else JobRecord.model_validate(data)

    def renew_lease(self, *, id: int, worker: str, lease_seconds: int = 60) -> JobRecord:
        return self._post(
            JobRecord, f"/v1/jobs/{id}/renew", {"worker": worker, "lease_seconds": lease_seconds}
        )

    def complete_job(self, *, id: int, worker: str, result: dict[str, Any]) -> JobRecord:
        return self._post(
            JobRecord, f"/v1/jobs/{id}/complete", {"worker": worker, "result": result}
        )

    def fail_job(self, *, id: int, worker: str, error: str, retry: bool = True) -> JobRecord:
        return self._post(
            JobRecord, f"/v1/jobs/{id}/fail", {"worker": worker, "error": error, "retry": retry}
        )

    def get_job(self, *, id: int) -> JobRecord:
        return self._get(JobRecord, f"/v1/jobs/{id}")

    def list_jobs(self, **params: Any) -> Page[JobRecord]:
        return self._get(Page[JobRecord], "/v1/jobs", **params)

    # -- drift ----------------------------------------------------------------------------

    def list_flags(self, **params: Any) -> Page[DriftFlagRecord]:
        return self._get(Page[DriftFlagRecord], "/v1/drift", **params)

    def get_flag(self, *, id: int) -> DriftFlagRecord:
        return self._get(DriftFlagRecord, f"/v1/drift/{id}")

    def ack_flag(self, *, id: int, reason: str) -> DriftFlagRecord:
        return self._post(DriftFlagRecord, f"/v1/drift/{id}/ack", {"reason": reason})

    def resolve_flag(self, *, id: int, reason: str) -> DriftFlagRecord:
        return self._post(DriftFlagRecord, f"/v1/drift/{id}/resolve", {"reason": reason})

    def check_drift(self, **body: Any) -> DriftCheckResult:
        return self._post(DriftCheckResult, "/v1/drift/check", body)

    def watch(self, *, lineage: str | None = None) -> list[WatchResult]:
        data = self.request("POST", "/v1/watch", json={"lineage": lineage})
        return TypeAdapter(list[WatchResult]).validate_python(data)
