"""Storing and reading measurements; the runner's numbers are handed in as plain dicts.

A measurement is reusable for a validation when the pair, the suite digest, the settings
digest and the runner version all match, so a pair is never re-measured for nothing and a
changed suite or runner is never mistaken for the old one, and when the policy's ``[trust]``
accepts how it was produced. Every measurement records its provenance: who stored it
(``created_by``), how (``produced_via``: ``job`` for a worker under a job, ``local`` for the
embedded registry's own user, ``http`` for a result self-reported over HTTP), the job, and a
worker's signature when it signed (:mod:`registry.trust.measurement_signing`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.errors import InvalidInput, NotFound
from registry.governance.policy import MEASURING_ENGINES, measuring_engine, settings_digest
from registry.params import Cursor, Id, Limit
from registry.records.core import Page, from_row
from registry.records.governance import MeasurementRecord
from registry.refs import resolve_pair
from registry.services.base import page_query
from registry.tables import Measurement, Pair
from registry.trust.audit import append_event, lock_writes
from registry.trust.measurement_signing import clean

_PROMPT_KEYS = ("id", "category")


def to_record(
    row: Measurement, pair_digest: str, *, with_prompts: bool = False
) -> MeasurementRecord:
    prompts = row.prompts if with_prompts else None
    return from_row(MeasurementRecord, row, pair_digest=pair_digest, prompts=prompts)


def _check_result(result: dict[str, Any]) -> None:
    if not isinstance(result, dict):
        raise InvalidInput("result must be an object", field="result")
    for key in ("categories", "prompts"):
        if key not in result:
            raise InvalidInput(f"result lacks {key!r}", field=f"result.{key}")
    if not isinstance(result["categories"], dict):
        raise InvalidInput("result.categories must be an object", field="result.categories")
    if not isinstance(result["prompts"], list):
        raise InvalidInput("result.prompts must be a list", field="result.prompts")
    for i, prompt in enumerate(result["prompts"]):
        if not isinstance(prompt, dict) or any(k not in prompt for k in _PROMPT_KEYS):
            raise InvalidInput(
                f"result.prompts[{i}] needs at least id and category", field="result.prompts"
            )
        for counter in ("accepted", "rejections"):
            value = prompt.get(counter, 0)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise InvalidInput(
                    f"result.prompts[{i}].{counter} must be a non-negative number",
                    field="result.prompts",
                )


def insert_measurement(
    session: Session,
    *,
    pair: Pair,
    suite_name: str,
    suite_digest: str,
    settings: dict[str, Any],
    runner_version: str,
    result: dict[str, Any],
    mlflow_run_id: str | None,
    device: str | None,
    job_id: int | None,
    actor: str,
    produced_via: str,
    signature: dict[str, Any] | None = None,
) -> Measurement:
    _check_result(result)
    result = clean(result)
    overall = result.get("overall") or {}
    alpha = overall.get("alpha")
    lock_writes(session)
    row = Measurement(
        pair_id=pair.id,
        suite_name=suite_name,
        suite_digest=suite_digest,
        settings=clean(settings),
        settings_digest=settings_digest(settings),
        runner_version=str(runner_version),
        device=device,
        hardware=result.get("hardware") or {},
        seed=settings.get("seed"),
        alpha=float(alpha) if isinstance(alpha, int | float) else None,
        overall=overall,
        categories=result["categories"],
        prompts=result["prompts"],
        extra={
            k: v
            for k, v in result.items()
            if k not in ("overall", "categories", "prompts", "hardware", "settings")
        },
        mlflow_run_id=mlflow_run_id,
        job_id=job_id,
        created_by=actor,
        produced_via=produced_via,
        signature=signature,
    )
    session.add(row)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="measurement.stored",
        entity_type="measurement",
        entity_id=row.id,
        payload={
            "pair_digest": pair.pair_digest,
            "suite_name": suite_name,
            "suite_digest": suite_digest,
            "settings_digest": row.settings_digest,
            "runner_version": row.runner_version,
            "alpha": row.alpha,
            "categories": {c: (v or {}).get("alpha") for c, v in row.categories.items()},
            "mlflow_run_id": mlflow_run_id,
            "job_id": job_id,
            "produced_via": produced_via,
            "signed_by": (signature or {}).get("key"),
        },
    )
    return row


def store_measurement(
    session: Session,
    *,
    pair: Annotated[str, Field(min_length=1, description="Pair id or digest prefix.")],
    suite_name: Annotated[str, Field(min_length=1, max_length=200)],
    suite_digest: Annotated[str, Field(min_length=1, max_length=64)],
    settings: dict[str, Any],
    runner_version: Annotated[str, Field(min_length=1, max_length=64)],
    result: dict[str, Any],
    mlflow_run_id: Annotated[str | None, Field(max_length=64)] = None,
    device: Annotated[str | None, Field(max_length=64)] = None,
    actor: str,
    via: Literal["local", "http"] = "local",
) -> MeasurementRecord:
    """Record a measurement taken outside a job (``pairreg measure``).

    It is stored with its provenance: ``local`` from the embedded registry's own user,
    ``http`` when self-reported over HTTP, which no policy trusts unless its ``[trust]``
    says so (a self-reported number must not open a gate)."""
    pair_row = resolve_pair(session, pair)
    row = insert_measurement(
        session,
        pair=pair_row,
        suite_name=suite_name,
        suite_digest=suite_digest,
        settings=settings,
        runner_version=runner_version,
        result=result,
        mlflow_run_id=mlflow_run_id,
        device=device,
        job_id=None,
        actor=actor,
        produced_via=via,
    )
    return to_record(row, pair_row.pair_digest)


def find_reusable(
    session: Session,
    pair: Pair,
    *,
    suite_name: str,
    settings: dict[str, Any],
    suite_digest: str | None,
    runner_versions: list[str],
    trust: dict[str, Any] | None = None,
) -> Measurement | None:
    """The newest stored measurement that answers exactly this request, taken by one of
    ``runner_versions`` and produced (how, and on which engine) as the policy's ``trust``
    section accepts, if any."""
    stmt = select(Measurement).where(
        Measurement.pair_id == pair.id,
        Measurement.suite_name == suite_name,
        Measurement.settings_digest == settings_digest(settings),
    )
    if suite_digest:
        stmt = stmt.where(Measurement.suite_digest == suite_digest)
    stmt = stmt.where(Measurement.runner_version.in_(runner_versions))
    engines = list(MEASURING_ENGINES)
    if trust is not None:
        stmt = stmt.where(Measurement.produced_via.in_(list(trust["measurements"])))
        if trust["require_signature"]:
            stmt = stmt.where(Measurement.signature.is_not(None))
        engines = list(trust.get("engines") or MEASURING_ENGINES)
    stmt = stmt.order_by(Measurement.id.desc())
    if set(engines) == set(MEASURING_ENGINES):
        return session.scalar(stmt.limit(1))
    # the engine lives in the measurement's JSON: checked here, newest first
    for row in session.scalars(stmt.limit(200)):
        if measuring_engine(row.extra) in engines:
            return row
    return None


def get_measurement(session: Session, *, id: Id, prompts: bool = True) -> MeasurementRecord:
    row = session.get(Measurement, id)
    if row is None:
        raise NotFound(f"no measurement with id {id}", field="id")
    pair = session.get(Pair, row.pair_id)
    assert pair is not None
    return to_record(row, pair.pair_digest, with_prompts=prompts)


def list_measurements(
    session: Session, *, pair: str | None = None, cursor: Cursor = None, limit: Limit = 100
) -> Page[MeasurementRecord]:
    stmt = select(Measurement)
    if pair:
        stmt = stmt.where(Measurement.pair_id == resolve_pair(session, pair).id)
    rows, next_cursor = page_query(session, stmt, Measurement.id, cursor, limit)
    digests = {
        p.id: p.pair_digest
        for p in session.scalars(select(Pair).where(Pair.id.in_({r.pair_id for r in rows})))
    }
    return Page[MeasurementRecord](
        items=[to_record(r, digests[r.pair_id]) for r in rows], next_cursor=next_cursor
    )
