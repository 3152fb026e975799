"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from api import metrics, tracing
from api.auth import TokenCache
from api.ingest_gc import IngestGcPause
from api.lanes import Lanes
from api.limits import BodyLimit, BodyLimits
from api.params import strict_query
from api.problems import install_problem_handlers, problem_openapi
from api.route_index import most_specific_route_only
from api.routes import ROUTERS
from api.tracing import provider_from_env
from registry.settings import Settings, get_settings

API_VERSION = "0.1.0"


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    # the write lane's worker processes, if any, finish the writes in flight and stop
    await asyncio.to_thread(app.state.lanes.close)


def create_app(settings: Settings | None = None, **state: Any) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        lifespan=_lifespan,
        title="pairreg",
        version=API_VERSION,
        description=(
            "Registry and governance for speculative-decoding pairs. Errors are "
            "application/problem+json (RFC 9457); lists are cursor-paginated."
        ),
        dependencies=[Depends(most_specific_route_only), Depends(strict_query)],
        # FastAPI's pages load Swagger UI and ReDoc from a CDN: /docs is served from this
        # origin instead (api/routes/docs.py).
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.tracer = tracing.tracer(state.pop("tracer_provider", None) or provider_from_env())
    app.state.db_url = settings.db_url
    # Operation routes run in a read or a write lane of worker threads (api/lanes.py).
    app.state.lanes = Lanes.from_settings(settings)
    app.state.token_cache = TokenCache(settings.token_cache_seconds)
    for key, value in state.items():
        setattr(app.state, key, value)
    install_problem_handlers(app)
    app.add_middleware(IngestGcPause)  # ingest batches: no cyclic GC once the body is in
    # Outermost: a body over its route family's cap is refused before anything reads it.
    app.add_middleware(BodyLimit, limits=BodyLimits.from_settings(settings))
    for module_name in ROUTERS:
        app.include_router(importlib.import_module(module_name).router)
    app.include_router(metrics.router)
    metrics.install_metrics(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = problem_openapi(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
