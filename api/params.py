"""Query parameters shared by every list route, so each documents them the same way."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, get_args, get_origin

from fastapi import Query, Request
from pydantic import AwareDatetime, BeforeValidator

from registry.errors import InvalidInput

MAX_LIMIT = 500


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]")


def _iso_text_only(value: object) -> object:
    """Refuse numbers (pydantic's lax mode would read ``0.5`` as a Unix time)."""
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError("expected an ISO-8601 date-time with a timezone, e.g. 2025-01-31T12:00Z")
    return value


Cursor = Annotated[
    str | None,
    Query(
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="`next_cursor` from the previous page; omit for the first page.",
    ),
]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size.")]
Timestamp = Annotated[
    AwareDatetime | None,
    BeforeValidator(_iso_text_only),
    Query(description="ISO-8601 date-time with a timezone, e.g. 2025-01-31T12:00:00Z."),
]


def _query_fields(dependant: Any) -> Iterator[Any]:
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _query_fields(sub)


def _is_sequence(annotation: Any) -> bool:
    if get_origin(annotation) in (list, tuple, set, frozenset):
        return True
    return any(_is_sequence(arg) for arg in get_args(annotation))


def strict_query(request: Request) -> None:
    """Refuse query parameters a route does not declare, and repeats of single-valued ones.

    Request bodies already forbid unknown fields; without this, ``?limt=5`` or
    ``?role=a&role=b`` would be silently ignored or half-read instead of answered 422.
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
