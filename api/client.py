"""The remote backend: every operation of the contract over HTTP.

``PairregClient(url, token)`` offers the same methods, keyword arguments and record classes
as the embedded backend, because both follow from ``registry.contract``: a call validates
its arguments with the operation's input model, places each one where the contract says
(path, query, JSON body or text body), and parses the answer into the operation's output
type. Problem responses come back as the same ``PairregError`` subclasses, so a CLI command
behaves identically in both modes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from registry.contract.operations import BY_NAME
from registry.contract.spec import Operation, Param
from registry.errors import ERROR_KINDS, InvalidInput, PairregError

__all__ = ["PairregClient", "RemoteUnavailable"]


class RemoteUnavailable(PairregError):
    kind = "unavailable"
    status = 503
    title = "Server unreachable"


def _wire(value: Any) -> Any:
    """A value as JSON would carry it (models and times included)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value


def _segment(p: Param, value: Any, path: str) -> str:
    # ``{ref:path}`` parameters may contain '/' (artifact refs are ``org/name@vN``).
    safe = "/@" if f"{{{p.name}:path}}" in path else "@"
    return quote(str(value), safe=safe)


class PairregClient:
    """Remote backend: ``PairregClient(url, token)``; methods raise ``PairregError``."""

    mode = "remote"

    def __init__(self, url: str, token: str | None = None, timeout: float = 300.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._adapters: dict[str, TypeAdapter[Any]] = {}

    def close(self) -> None:
        self.http.close()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        op = BY_NAME.get(name)
        if op is None:
            raise AttributeError(name)

        def call(**kwargs: Any) -> Any:
            return self.invoke(op, kwargs)

        call.__name__ = name
        call.__doc__ = op.description
        return call

    # -- plumbing -------------------------------------------------------------------------

    def invoke(self, op: Operation, kwargs: dict[str, Any]) -> Any:
        if op.path is None:
            raise InvalidInput(op.local_only or f"{op.name} runs only embedded", field="url")
        values = op.check(kwargs)
        path = op.path
        for p in op.params_in("path"):
            placeholder = f"{{{p.name}:path}}" if f"{{{p.name}:path}}" in path else f"{{{p.name}}}"
            path = path.replace(placeholder, _segment(p, values[p.name], op.path))
        query = {
            p.wire_name: _wire(values[p.name])
            for p in op.params_in("query")
            if values.get(p.name) is not None
        }
        request: dict[str, Any] = {"params": query}
        texts = op.params_in("text")
        if texts:
            request["content"] = str(values[texts[0].name]).encode()
            request["headers"] = {"Content-Type": "text/plain"}
        elif op.params_in("body"):
            request["json"] = {
                p.wire_name: _wire(values[p.name]) for p in op.params_in("body") if p.name in values
            }
        data = self.request(op.method, path, **request)
        adapter = self._adapters.get(op.name)
        if adapter is None:
            adapter = self._adapters[op.name] = TypeAdapter(op.output)
        return adapter.validate_python(data)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteUnavailable(f"cannot reach pairreg server at {self.url}: {exc}") from exc
        if resp.status_code >= 400:
            raise self._error(resp)
        return resp.json()

    @staticmethod
    def _error(resp: httpx.Response) -> PairregError:
        try:
            body = resp.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
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
