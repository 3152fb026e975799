"""Query-string strictness: unknown or repeated parameters are refused, not ignored."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args, get_origin

from fastapi import Request

from registry.errors import InvalidInput


def _query_fields(dependant: Any) -> Iterator[Any]:
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _query_fields(sub)


def _is_sequence(annotation: Any) -> bool:
    if get_origin(annotation) in (list, tuple, set, frozenset):
        return True
    return any(_is_sequence(arg) for arg in get_args(annotation))


async def strict_query(request: Request) -> None:
    """Refuse query parameters a route does not declare, and repeats of single-valued ones.

    Request bodies already forbid unknown fields; without this, ``?limt=5`` or
    ``?role=a&role=b`` would be silently ignored or half-read instead of answered 422.
    Async (no I/O): as a plain function it took a worker thread per request.
    """
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    fields = {f.alias: f for f in _query_fields(dependant)}
    for name in request.query_params:
        field = fields.get(name)
        if field is None:
            raise InvalidInput(f"unknown query parameter {name!r}", field=name or "query")
        values = request.query_params.getlist(name)
        if len(values) > 1 and not _is_sequence(field.field_info.annotation):
            raise InvalidInput(f"query parameter {name!r} given {len(values)} times", field=name)
