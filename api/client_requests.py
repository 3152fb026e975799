"""Remote-client methods for request tags, telemetry, exports and audit reconstruction."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from api.client_base import ClientBase, _params
from registry.errors import InvalidInput
from registry.records_requests import (
    ExportResult,
    IngestResult,
    RequestAudit,
    RequestPage,
    RequestTagRecord,
    TagIn,
    TelemetryResult,
)


class RequestsClientMixin(ClientBase):
    """Methods mirror the service operations of the same names."""

    def ingest_requests(self, *, tags: list[TagIn] | list[dict[str, Any]]) -> IngestResult:
        body = [t.model_dump(mode="json") if isinstance(t, TagIn) else t for t in tags]
        return self._post(IngestResult, "/v1/requests", {"tags": body})

    def audit_request(self, *, request_id: str) -> RequestAudit:
        return self._get(RequestAudit, f"/v1/requests/{quote(request_id, safe='')}")

    def get_request_tag(self, *, request_id: str) -> RequestTagRecord:
        return self.audit_request(request_id=request_id).tag

    def list_requests(self, **params: Any) -> RequestPage:
        return self._get(RequestPage, "/v1/requests", **params)

    def build_bundle(self, *, request_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/requests/{quote(request_id, safe='')}/bundle")

    def ingest_prometheus(
        self, *, deployment: str, text: str, source: str = "push", min_drafted: int = 1000
    ) -> TelemetryResult:
        data = self.request(
            "POST",
            "/v1/telemetry/prometheus",
            params=_params(deployment=deployment, source=source, min_drafted=min_drafted),
            content=text.encode(),
            headers={"Content-Type": "text/plain"},
        )
        return TelemetryResult.model_validate(data)

    def export_serving(self, *, deployment: str, engine: str) -> ExportResult:
        return self._get(ExportResult, f"/v1/exports/{quote(engine)}", deployment=deployment)

    def maintain_partitions(self, *, ahead: int = 3) -> dict[str, Any]:
        raise InvalidInput(
            "partition maintenance runs against the database: unset PAIRREG_URL and set "
            "PAIRREG_DATABASE_URL on a host that can reach it",
            field="url",
        )
