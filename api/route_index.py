"""Every HTTP route the app serves, flattened across included routers.

FastAPI nests included routers, so ``app.routes`` alone does not list every path. The
405 handler uses this index to answer with an ``Allow`` header naming every method the
URL supports, and the role-matrix test uses it to find routes that lack a declared role.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request


@dataclass(frozen=True)
class RouteInfo:
    path: str
    methods: frozenset[str]
    path_regex: re.Pattern[str]
    endpoint: Any
    include_in_schema: bool

    @property
    def specificity(self) -> int:
        """Characters outside ``{params}``: ``/a/{x}/verify`` is more specific than ``/a/{x}``."""
        return len(re.sub(r"\{[^}]*\}", "", self.path))


def _contexts(app: FastAPI) -> Iterator[Any]:
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # older FastAPI: included routes are already flat
        yield from app.routes
        return
    yield from iter_route_contexts(app.routes)


def iter_routes(app: FastAPI) -> Iterator[RouteInfo]:
    """HTTP routes with their methods (HEAD included where the framework adds it)."""
    for route in _contexts(app):
        path = getattr(route, "path", None)
        methods = getattr(route, "methods", None)
        regex = getattr(route, "path_regex", None)
        if path is None or not methods or regex is None:
            continue
        yield RouteInfo(
            path=path,
            methods=frozenset(m.upper() for m in methods),
            path_regex=regex,
            endpoint=getattr(route, "endpoint", None),
            include_in_schema=bool(getattr(route, "include_in_schema", True)),
        )


def _index(app: FastAPI) -> tuple[RouteInfo, ...]:
    """:func:`iter_routes`, flattened once per app (about 0.5 ms a walk, paid on every
    request before) and again only if routes were added since."""
    cached = getattr(app.state, "_route_index", None)
    if cached is not None and cached[0] == len(app.routes):
        return cached[1]  # type: ignore[no-any-return]
    index = tuple(iter_routes(app))
    app.state._route_index = (len(app.routes), index)
    return index


def allowed_methods(app: FastAPI, url_path: str) -> list[str]:
    """Methods of the most specific route templates matching ``url_path``.

    ``/v1/artifacts/X/verify`` also matches ``/v1/artifacts/{ref:path}``, but the schema
    documents it as the ``…/verify`` resource, so only that template's methods count.
    """
    matching = [r for r in _index(app) if r.path_regex.match(url_path)]
    if not matching:
        return []
    best = max(r.specificity for r in matching)
    methods: set[str] = set()
    for route in matching:
        if route.specificity == best:
            methods |= route.methods
    return sorted(methods)


async def most_specific_route_only(request: Request) -> None:
    """Answer 405 when a more specific route owns this URL but not this method.

    ``GET /v1/jobs/claim`` also matches ``GET /v1/jobs/{id}``; without this it would be a
    confusing 422 about ``id`` instead of "``/v1/jobs/claim`` takes POST". Async (a few
    regular-expression matches, no I/O): as a plain function it took a worker thread per
    request.
    """
    allow = allowed_methods(request.app, request.url.path)
    if allow and request.method not in allow and not (request.method == "HEAD" and "GET" in allow):
        raise HTTPException(405, "Method Not Allowed", headers={"Allow": ", ".join(allow)})
