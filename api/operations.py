"""HTTP routes derived from the operation contract: one route per declared operation.

Each route authenticates the caller against the operation's roles, reads path, query and
body parameters as the contract places them, runs the service in one transaction with the
caller as actor (committed before the response is built, so a 2xx means durable; a
deadlock victim or a connection lost mid-transaction is rolled back and run again), and
answers with the operation's status. Nothing here knows any single operation. Reads and
writes run in separate lanes of worker threads (api/lanes.py).
"""

from __future__ import annotations

import inspect
import logging
import re
import typing
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic.fields import FieldInfo

from api.auth import Principal, after_write, require_in_read_lane
from api.json_body import direct_json_route
from api.lanes import lanes
from registry.contract.operations import OPERATIONS
from registry.contract.run import run
from registry.contract.spec import CallContext, Operation, Param
from registry.settings import Settings

logger = logging.getLogger("pairreg.api")
_PARAM = re.compile(r"\{[^}]*\}")


def _split(annotation: Any) -> tuple[Any, list[Any], FieldInfo | None]:
    """``Annotated[T, *meta]`` into ``T``, its non-FieldInfo metadata and its FieldInfo."""
    if typing.get_origin(annotation) is not Annotated:
        return annotation, [], None
    base, *meta = typing.get_args(annotation)
    infos = [m for m in meta if isinstance(m, FieldInfo)]
    rest = [m for m in meta if not isinstance(m, FieldInfo)]
    info = infos[-1] if infos else None
    if info is not None:
        rest = list(info.metadata) + rest
    inner_base, inner_rest, inner_info = _split(base)
    return inner_base, inner_rest + rest, info or inner_info


def _http_param(p: Param) -> inspect.Parameter:
    """A FastAPI parameter for a path or query input, keeping the service's constraints."""
    base, meta, info = _split(p.annotation)
    description = info.description if info else None
    default = inspect.Parameter.empty if p.required else p.default
    if p.location == "path":
        marker: Any = Path(description=description)
    else:
        marker = Query(alias=p.wire_name, description=description)
    return inspect.Parameter(
        p.name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[(base, *meta, marker)],
        default=default,
    )


OPERATIONS_BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}


def execute(settings: Settings, op: Operation, values: Mapping[str, Any]) -> Any:
    """Run ``op`` for a remote caller (``values`` carry the actor the route authenticated)
    through the one :func:`registry.contract.run.run` the embedded backend uses too.

    Where it runs is the lane's business (``api/lanes.py``): a worker thread, or a write
    worker process (``api/write_pool.py``), which calls this same function."""
    return run(op, values, CallContext(settings=settings, remote=True))


def _endpoint(op: Operation, *, read_body: bool) -> Any:
    """A route function with a synthesised signature FastAPI can read.

    The service runs in the operation's lane (api/lanes.py): ``GET`` operations on a
    worker thread of the read lane, the others in the write lane (threads, or worker
    processes with ``PAIRREG_WRITE_PROCESSES``), so reads never wait for a thread behind
    writes queued on the registry's write lock."""
    body_model = op.body_model if read_body else None
    text = op.params_in("text")
    body_params = op.params_in("body")

    async def endpoint(request: Request, response: Response, **kwargs: Any) -> Any:
        principal: Principal = kwargs.pop("_principal")
        values: dict[str, Any] = {}
        body = kwargs.pop("_body", None)
        if body is not None:
            values.update({p.name: getattr(body, p.name) for p in body_params})
        values.update(kwargs)
        if op.takes_actor:
            values["actor"] = principal.actor
        # the operation's method, not the route's: a write's GET alias is still a write
        lane = lanes(request).for_method(op.method)
        result = await lane.run_operation(request.app.state.settings, op, values)
        after_write(request, op)
        response.status_code = op.status_for(result)
        return result

    params = [
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request),
        inspect.Parameter("response", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Response),
        inspect.Parameter(
            "_principal",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Principal,
            default=Depends(require_in_read_lane(op.roles)),
        ),
    ]
    params += [_http_param(p) for p in op.params_in("path", "query")]
    for p in text:
        params.append(
            inspect.Parameter(
                p.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=str,
                default=Body(..., media_type="text/plain", description=_describe(p)),
            )
        )
    if body_model is not None:
        optional = all(not p.required for p in op.params_in("body"))
        params.append(
            inspect.Parameter(
                "_body",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=body_model | None if optional else body_model,
                default=Body(None if optional else ...),
            )
        )
    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = op.name
    endpoint.__doc__ = op.description
    return endpoint


def _describe(p: Param) -> str | None:
    _, _, info = _split(p.annotation)
    return info.description if info else None


def _specificity(op: Operation) -> tuple[int, int]:
    """Literal characters first: ``/v1/jobs/claim`` must be tried before ``/v1/jobs/{id}``."""
    path = op.path or ""
    return (-len(_PARAM.sub("", path)), -path.count("/"))


def build_router() -> APIRouter:
    router = APIRouter()
    for op in sorted((o for o in OPERATIONS if o.path), key=_specificity):
        assert op.path is not None
        responses: dict[int | str, dict[str, Any]] = {}
        if op.unchanged is not None:
            responses[op.unchanged[1]] = {"model": op.output, "description": op.unchanged[2]}
        common: dict[str, Any] = {
            "response_model": op.response_model or op.output,
            "status_code": op.status,
            "summary": op.summary,
            "description": op.description,
            "tags": [op.tag],
            "responses": responses,
            "operation_id": op.name,
        }
        direct = op.json_body_direct and op.body_model is not None
        router.add_api_route(
            op.path,
            _endpoint(op, read_body=True),
            methods=[op.method],
            route_class_override=(
                direct_json_route(op.body_model, op.json_body_fast) if direct else None  # type: ignore[arg-type]
            ),
            **common,
        )
        if op.also_get:
            router.add_api_route(
                op.path,
                _endpoint(op, read_body=False),
                methods=["GET"],
                **{**common, "operation_id": f"{op.name}_get", "summary": op.summary},
            )
    return router


router = build_router()
