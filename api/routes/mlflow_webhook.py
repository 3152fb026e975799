"""``POST /v1/mlflow/webhook``: MLflow registry webhooks in (docs/lifecycle.md).

This route authenticates by signature, not by bearer token: MLflow signs each delivery with
the secret it was given (``PAIRREG_MLFLOW_WEBHOOK_SECRET`` here). The order is fixed so that
a forged, stale or replayed delivery changes nothing: check the signature and timestamp
(401), look the delivery id up (seen: 200, nothing done), fetch the version's files from
MLflow's artifact store (unreachable: 503, so MLflow retries), then remember the id and
register the files in one transaction. The rules live in ``registry.integrations.mlflow_hooks`` and
``registry.services.mlflow_sources``; this edge only reads the request and fetches.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError

from registry import db
from registry.errors import PairregError
from registry.integrations.mlflow_hooks import MlflowDeliveryIn, verify_delivery
from registry.services import mlflow_sources
from registry.settings import Settings

router = APIRouter(tags=["mlflow"])
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
ACTOR = "mlflow:webhook"


class MlflowUnavailable(PairregError):
    """The tracking server or its artifact store did not give the version's files."""

    kind = "mlflow_unavailable"
    status = 503
    title = "MLflow unreachable"


def _tracking_uri(settings: Settings) -> str:
    from runner.mlflow_log import default_tracking_uri  # the runner's own default

    return settings.mlflow_tracking_uri or default_tracking_uri()


def _handle(settings: Settings, d: MlflowDeliveryIn) -> dict[str, Any]:
    with db.session_scope(settings.db_url) as s:
        plan = mlflow_sources.plan_delivery(s, d)
    if plan.action == "replay":
        return {"delivery_id": d.delivery_id, "event": d.event, "outcome": {"action": "replay"}}
    fetched = None
    if plan.action == "register":
        from runner.mlflow_fetch import MlflowFetchError, fetch_model_version

        uri = _tracking_uri(settings)
        dest = (
            settings.home_dir
            / "models"
            / "mlflow"
            / _SAFE.sub("_", plan.registered_model or "")
            / _SAFE.sub("_", plan.version or "")
        )
        try:
            files = fetch_model_version(uri, plan.registered_model or "", plan.version or "", dest)
        except MlflowFetchError as exc:
            raise MlflowUnavailable(str(exc), field="data") from exc
        fetched = mlflow_sources.FetchedVersion(files.directory, files.source, files.run_id, uri)
    try:
        with db.session_scope(settings.db_url) as s:
            rec = mlflow_sources.record_delivery(s, d, plan, fetched, actor=ACTOR)
    except IntegrityError:  # the same id raced in: the other request acted on it
        return {"delivery_id": d.delivery_id, "event": d.event, "outcome": {"action": "replay"}}
    return rec.model_dump(mode="json")


@router.post(
    "/v1/mlflow/webhook",
    summary="Receive an MLflow registry webhook (signed; no bearer token)",
    responses={401: {"description": "Signature, timestamp or headers refused"}},
)
async def mlflow_webhook(request: Request) -> JSONResponse:
    settings: Settings = request.app.state.settings
    body = await request.body()
    d = verify_delivery(
        settings.mlflow_webhook_secret,
        dict(request.headers),
        body,
        now=time.time(),
        tolerance=settings.mlflow_webhook_tolerance,
    )
    result = await asyncio.to_thread(_handle, settings, d)
    return JSONResponse(result)
