"""Liveness and readiness probes."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError

from api.problems import problem_response
from registry import db
from registry.errors import SchemaOutOfDate

router = APIRouter(tags=["health"])
logger = logging.getLogger("pairreg.api")


class Health(BaseModel):
    status: str
    schema_revision: str | None = None


@router.get("/healthz", response_model=Health, summary="The process is up")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, summary="Database reachable and schema current")
def readyz(request: Request) -> Health | JSONResponse:
    url = request.app.state.db_url
    try:
        db.require_current_schema(url)
    except SchemaOutOfDate as exc:
        return problem_response(503, exc.title, exc.message, exc.kind)
    except SQLAlchemyError as exc:
        # The probe is public: the driver's text (host, port, user, database, the server's
        # own message) goes to the server log only.
        logger.warning("readiness: database unreachable: %s", str(exc).splitlines()[0])
        return problem_response(
            503,
            "Database unreachable",
            "the database is unreachable; the server log says why",
            "database",
        )
    return Health(status="ready", schema_revision=db.head_revision())
