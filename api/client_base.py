"""HTTP plumbing for the remote client: requests, and problem+json back to PairregError."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from registry.errors import ERROR_KINDS, PairregError

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


class ClientBase:
    """HTTP plumbing shared by every area's client mixin."""

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
