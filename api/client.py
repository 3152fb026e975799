"""A small typed HTTP client whose methods mirror the service operations.

The CLI's remote mode uses it in place of the embedded backend: same method names, same
keyword arguments, same record classes back, and the same ``PairregError`` subclasses for
problem responses, so every command behaves identically in both modes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from registry.errors import ERROR_KINDS, InvalidInput, PairregError
from registry.records import (
    ArtifactAddResult,
    ArtifactRecord,
    AuditEventRecord,
    ChainVerifyResult,
    Page,
    PairRecord,
    PairRegisterResult,
    Provenance,
    TokenCreated,
    TokenRecord,
    VerifyReport,
)

M = TypeVar("M", bound=BaseModel)


class RemoteUnavailable(PairregError):
    kind = "unavailable"
    status = 503
    title = "Server unreachable"


def _ref(ref: str) -> str:
    return quote(ref, safe="/@")


def _params(**kwargs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if value is None:
            continue
        out[key] = value.isoformat() if isinstance(value, datetime) else value
    return out


class PairregClient:
    """Remote backend: ``PairregClient(url, token)``; methods raise ``PairregError``."""

    mode = "remote"

    def __init__(self, url: str, token: str | None = None, timeout: float = 300.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    # -- plumbing -------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteUnavailable(f"cannot reach pairreg server at {self.url}: {exc}") from exc
        if resp.status_code >= 400:
            raise self._error(resp)
        return resp.json()

    def _get(self, model: type[M], path: str, **params: Any) -> M:
        return model.model_validate(self.request("GET", path, params=_params(**params)))

    def _post(self, model: type[M], path: str, body: dict[str, Any] | None = None) -> M:
        return model.model_validate(self.request("POST", path, json=body or {}))

    @staticmethod
    def _error(resp: httpx.Response) -> PairregError:
        try:
            body = resp.json()
        except ValueError:
            body = {}
        detail = body.get("detail") or resp.text or resp.reason_phrase
        if not isinstance(detail, str):
            detail = str(detail)
        cls = ERROR_KINDS.get(body.get("kind", ""))
        if cls is None:
            err = PairregError(f"HTTP {resp.status_code}: {detail}", field=body.get("field"))
            err.status = resp.status_code
            return err
        return cls(detail, field=body.get("field"))

    # -- artifacts ------------------------------------------------------------------------

    def add_artifact(
        self, *, source: str, name: str, role: str, provenance: Provenance | None = None
    ) -> ArtifactAddResult:
        body = {
            "source": source,
            "name": name,
            "role": role,
            "provenance": (provenance or Provenance()).model_dump(),
        }
        return self._post(ArtifactAddResult, "/v1/artifacts", body)

    def get_artifact(self, *, ref: str) -> ArtifactRecord:
        return self._get(ArtifactRecord, f"/v1/artifacts/{_ref(ref)}")

    def list_artifacts(self, **params: Any) -> Page[ArtifactRecord]:
        return self._get(Page[ArtifactRecord], "/v1/artifacts", **params)

    def verify_artifact(self, *, ref: str, path: str | None = None) -> VerifyReport:
        return self._post(VerifyReport, f"/v1/artifacts/{_ref(ref)}/verify", {"path": path})

    # -- pairs ----------------------------------------------------------------------------

    def register_pair(
        self,
        *,
        target: str,
        draft: str | None = None,
        method: str,
        k: int,
        options: dict[str, Any] | None = None,
        strict: bool = False,
    ) -> PairRegisterResult:
        if not isinstance(k, int):
            raise InvalidInput("k must be an integer", field="k")
        body = {
            "target": target,
            "draft": draft,
            "method": method,
            "k": k,
            "options": options or {},
            "strict": strict,
        }
        return self._post(PairRegisterResult, "/v1/pairs", body)

    def get_pair(self, *, ref: str) -> PairRecord:
        return self._get(PairRecord, f"/v1/pairs/{_ref(ref)}")

    def list_pairs(self, **params: Any) -> Page[PairRecord]:
        return self._get(Page[PairRecord], "/v1/pairs", **params)

    # -- audit ----------------------------------------------------------------------------

    def list_audit_events(self, **params: Any) -> Page[AuditEventRecord]:
        return self._get(Page[AuditEventRecord], "/v1/audit/events", **params)

    def verify_audit_chain(self, *, checkpoint: dict[str, Any] | None = None) -> ChainVerifyResult:
        if checkpoint is None:
            return self._get(ChainVerifyResult, "/v1/audit/verify")
        return self._post(ChainVerifyResult, "/v1/audit/verify", {"checkpoint": checkpoint})

    def create_audit_checkpoint(self) -> dict[str, Any]:
        return self.request("POST", "/v1/audit/checkpoint")

    # -- tokens ---------------------------------------------------------------------------

    def create_token(self, *, name: str, role: str) -> TokenCreated:
        return self._post(TokenCreated, "/v1/tokens", {"name": name, "role": role})

    def list_tokens(self, **params: Any) -> Page[TokenRecord]:
        return self._get(Page[TokenRecord], "/v1/tokens", **params)

    def revoke_token(self, *, name: str) -> TokenRecord:
        return TokenRecord.model_validate(self.request("DELETE", f"/v1/tokens/{quote(name)}"))
