"""A small typed HTTP client whose methods mirror the service operations.

The CLI's remote mode uses it in place of the embedded backend: same method names, same
keyword arguments, same record classes back, and the same ``PairregError`` subclasses for
problem responses, so every command behaves identically in both modes. Each area keeps
its methods in a mixin module (``client_governance``, ``client_requests``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from api.client_base import ClientBase, RemoteUnavailable, _ref
from api.client_governance import GovernanceClientMixin
from api.client_requests import RequestsClientMixin
from registry.errors import InvalidInput
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

__all__ = ["PairregClient", "RemoteUnavailable"]


class CoreClientMixin(ClientBase):
    """Artifacts, pairs, audit log and tokens."""

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

    def list_audit_events(
        self, *, by_actor: str | None = None, **params: Any
    ) -> Page[AuditEventRecord]:
        return self._get(Page[AuditEventRecord], "/v1/audit/events", actor=by_actor, **params)

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


class PairregClient(GovernanceClientMixin, RequestsClientMixin, CoreClientMixin):
    """Remote backend: ``PairregClient(url, token)``; methods raise ``PairregError``."""
