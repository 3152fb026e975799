"""RFC 9457 problem details: every error a client can cause, in one documented shape."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DataError, DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.route_index import allowed_methods
from registry.contract.spec import describe_error
from registry.errors import PairregError
from registry.outages import OutageError, classify, data_paths

PROBLEM_MEDIA_TYPE = "application/problem+json"
logger = logging.getLogger("pairreg.api")


class Problem(BaseModel):
    """``application/problem+json`` body; ``field`` names the offending input when known."""

    type: str = Field(default="about:blank", examples=["https://pairreg.dev/problems/not_found"])
    title: str
    status: int
    detail: str
    kind: str = Field(description="invalid, not_found, conflict, unauthorized, forbidden, …")
    field: str | None = None
    errors: list[dict[str, Any]] | None = None


def problem_response(
    status: int,
    title: str,
    detail: str,
    kind: str,
    field: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = Problem(
        type=f"https://pairreg.dev/problems/{kind}",
        title=title,
        status=status,
        detail=detail,
        kind=kind,
        field=field,
        errors=errors,
    )
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def _field_of(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or (str(loc[-1]) if loc else "request")


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(PairregError)
    async def _pairreg(_: Request, exc: PairregError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:  # a limit that frees up by itself: come back then
            headers = {"Retry-After": str(retry_after)}
        return problem_response(
            exc.status, exc.title, exc.message, exc.kind, exc.field, headers=headers
        )

    @app.exception_handler(OverflowError)
    @app.exception_handler(DataError)
    async def _out_of_range(request: Request, exc: Exception) -> JSONResponse:
        # A safety net, not the design: routes should bound their inputs. An integer too
        # large for the driver (SQLite) or the column type (PostgreSQL), or a string too
        # long for its column, is the client's input, not a server fault.
        logger.warning("%s %s: %s", request.method, request.url.path, str(exc).splitlines()[0])
        return problem_response(
            422,
            "Invalid input",
            "a value in the request is out of range for the registry's storage",
            "invalid",
        )

    @app.exception_handler(OSError)
    @app.exception_handler(DBAPIError)
    @app.exception_handler(OutageError)  # classified in a write worker (api/write_pool.py)
    async def _outage(request: Request, exc: Exception) -> JSONResponse:
        # A full disk or a lost database is the environment's fault: say so, and tell the
        # client to come back (the write was one transaction, so nothing of it was stored).
        outage = classify(exc, where=data_paths(getattr(request.app.state, "settings", None)))
        if outage is None:
            raise exc
        logger.warning("%s %s: %s", request.method, request.url.path, outage.detail)
        return problem_response(
            outage.status,
            outage.title,
            outage.detail,
            outage.kind,
            headers={"Retry-After": "1"},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                # A JSON syntax error's location is a character offset, not a field.
                "field": "body" if e.get("type") == "json_invalid" else _field_of(e.get("loc", ())),
                "message": e.get("msg", "invalid"),
                "detail": describe_error(e, (_field_of(e.get("loc", ())),)),
            }
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"field": "request", "detail": "request: invalid"}
        return problem_response(
            422,
            "Invalid input",
            first["detail"],
            "invalid",
            first["field"],
            [{"field": e["field"], "message": e["message"]} for e in errors],
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode (bad UTF-8, truncated JSON).
            return problem_response(422, "Invalid input", f"body: {exc.detail}", "invalid", "body")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Starlette names only the first matching route's methods; list them all.
            allow = allowed_methods(request.app, request.url.path)
            if allow:
                headers["Allow"] = ", ".join(allow)
        kind = {
            404: "not_found",
            405: "method_not_allowed",
            401: "unauthorized",
            403: "forbidden",
        }.get(exc.status_code, "http_error")
        return problem_response(
            exc.status_code,
            str(exc.detail),
            str(exc.detail),
            kind,
            headers=headers or None,
        )


ERROR_CODES = ["401", "403", "404", "409", "422"]
ALWAYS = ["401", "403", "422"]  # every authenticated operation: no token, wrong role, bad input
ERROR_DESCRIPTIONS = {
    "401": "Missing, unknown or revoked bearer token",
    "403": "The token's role may not do this",
    "404": "Unknown reference",
    "408": "The request body did not arrive within PAIRREG_BODY_TIMEOUT seconds",
    "409": "Conflicts with what is recorded",
    "413": "The request body is larger than its route family's cap (docs/api.md#limits)",
    "422": "Invalid input; `field` names it",
    "503": "Database unreachable or schema out of date",
    "507": "Disk full on the server",
}


def problem_openapi(schema: dict[str, Any]) -> dict[str, Any]:
    """Declare every error response as problem+json so the schema matches what is sent."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    ref = {"$ref": "#/components/schemas/Problem"}
    from registry.contract.operations import BY_NAME

    for path, path_item in schema.get("paths", {}).items():
        for method, op in path_item.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            responses = op["responses"]
            declared = BY_NAME.get(op.get("operationId", "").removesuffix("_get"))
            if declared is not None:
                codes = sorted({*ALWAYS, *(str(s) for s in declared.error_statuses)})
            else:
                codes = ERROR_CODES if path.startswith("/v1/") else []
            if path.startswith("/v1/"):
                # what any operation may meet: its database lost; a write, a full disk; a
                # body, the caps and the deadline of api/limits.py
                codes = [*codes, "503"] + (["507"] if method != "get" else [])
                if "requestBody" in op:
                    codes = [*codes, "408", "413"]
            if path == "/readyz":
                codes = ["503"]
            codes = sorted(set(codes))
            for code in codes:
                responses[code] = {
                    "description": responses.get(code, {}).get("description")
                    or ERROR_DESCRIPTIONS[code],
                    "content": {PROBLEM_MEDIA_TYPE: {"schema": ref}},
                }
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    return schema
