"""MLflow registry webhooks in: a registered model mapped to a lineage, and each accepted
delivery acted on once.

A mapped version that an alias moves to (or, with no aliases configured, any new version)
is registered through the ordinary ``add_artifact`` path, by content digest, with the
MLflow model version as provenance: for a target lineage that is a target change like a
Hub branch move (candidate pairs, re-measurement jobs, drift test), nothing specific to
MLflow. The signature is checked before any of this
(``registry.integrations.mlflow_hooks``); the files
are fetched by the edge with the runner's MLflow client (the registry never imports mlflow)
between :func:`plan_delivery` and :func:`record_delivery`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.errors import Conflict, InvalidInput
from registry.integrations.mlflow_hooks import MlflowDeliveryIn
from registry.params import Cursor, Limit
from registry.records.core import Page, Provenance, from_row
from registry.records.lifecycle import MlflowDeliveryRecord, MlflowSourceRecord
from registry.services.artifacts import ROLES, add_artifact
from registry.services.base import page_query
from registry.tables import MlflowDelivery, MlflowSource
from registry.trust.audit import append_event, lock_writes

# The events that can register a version; others are remembered and ignored.
ALIAS_EVENT = "model_version_alias.created"
VERSION_EVENT = "model_version.created"


def map_mlflow_model(
    session: Session,
    *,
    registered_model: Annotated[
        str, Field(min_length=1, max_length=500, description="MLflow registered model name.")
    ],
    lineage: Annotated[str, Field(min_length=1, max_length=200)],
    role: str = "target",
    aliases: Annotated[
        list[str],
        Field(
            description="Aliases whose moves register the version (e.g. champion); empty: "
            "every new version."
        ),  # fmt: skip
    ] = [],  # noqa: B006 - pydantic copies defaults
    actor: str,
) -> MlflowSourceRecord:
    """Follow an MLflow registered model as a pairreg lineage (idempotent for the same map)."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}", field="role")
    if any(not a.strip() or len(a) > 255 for a in aliases):
        raise InvalidInput("aliases must be non-empty names", field="aliases")
    lock_writes(session)
    existing = session.scalar(
        select(MlflowSource).where(MlflowSource.registered_model == registered_model)
    )
    wanted = {"lineage": lineage, "role": role, "aliases": sorted(set(aliases))}
    if existing is not None:
        have = {"lineage": existing.lineage, "role": existing.role, "aliases": existing.aliases}
        if have != wanted:
            raise Conflict(
                f"MLflow model {registered_model} already maps to {existing.lineage}",
                field="registered_model",
            )
        return from_row(MlflowSourceRecord, existing)
    src = MlflowSource(registered_model=registered_model, created_by=actor, **wanted)
    session.add(src)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="mlflow.source_mapped",
        entity_type="lineage",
        entity_id=lineage,
        payload={"registered_model": registered_model, **wanted},
    )
    return from_row(MlflowSourceRecord, src)


def list_mlflow_sources(
    session: Session, *, cursor: Cursor = None, limit: Limit = 100
) -> Page[MlflowSourceRecord]:
    rows, nxt = page_query(session, select(MlflowSource), MlflowSource.id, cursor, limit)
    return Page[MlflowSourceRecord](
        items=[from_row(MlflowSourceRecord, r) for r in rows], next_cursor=nxt
    )


def list_mlflow_deliveries(
    session: Session, *, cursor: Cursor = None, limit: Limit = 100
) -> Page[MlflowDeliveryRecord]:
    """Every MLflow delivery pairreg accepted, with what it did (forged ones never get here)."""
    rows, nxt = page_query(session, select(MlflowDelivery), MlflowDelivery.id, cursor, limit)
    return Page[MlflowDeliveryRecord](
        items=[from_row(MlflowDeliveryRecord, r) for r in rows], next_cursor=nxt
    )


@dataclass(frozen=True)
class DeliveryPlan:
    """What an accepted delivery asks for: ``replay`` (seen before: do nothing), ``ignore``
    (remembered, nothing to register) or ``register`` (fetch ``name``/``version``)."""

    action: str
    reason: str = ""
    registered_model: str | None = None
    version: str | None = None
    alias: str | None = None
    lineage: str | None = None
    role: str | None = None


@dataclass(frozen=True)
class FetchedVersion:
    """A model version's files as the edge fetched them from MLflow's artifact store."""

    directory: Path
    source: str
    run_id: str | None
    tracking_uri: str


def plan_delivery(session: Session, d: MlflowDeliveryIn) -> DeliveryPlan:
    if session.scalar(select(MlflowDelivery.id).where(MlflowDelivery.delivery_id == d.delivery_id)):
        return DeliveryPlan("replay", "delivery id already acted on")
    if d.event not in (ALIAS_EVENT, VERSION_EVENT):
        return DeliveryPlan("ignore", f"event {d.event} registers nothing")
    name, version = d.data.get("name"), d.data.get("version")
    if not isinstance(name, str) or not isinstance(version, str | int):
        raise InvalidInput("data.name and data.version are required", field="data")
    src = session.scalar(select(MlflowSource).where(MlflowSource.registered_model == name))
    if src is None:
        return DeliveryPlan("ignore", f"MLflow model {name} is not mapped to a lineage")
    alias = d.data.get("alias") if d.event == ALIAS_EVENT else None
    if src.aliases and (alias not in src.aliases):
        return DeliveryPlan("ignore", f"{d.event} for an alias not followed ({alias})")
    if not src.aliases and d.event == ALIAS_EVENT:
        return DeliveryPlan("ignore", "every new version is followed; alias moves add nothing")
    return DeliveryPlan(
        "register",
        registered_model=name,
        version=str(version),
        alias=alias if isinstance(alias, str) else None,
        lineage=src.lineage,
        role=src.role,
    )


def record_delivery(
    session: Session,
    d: MlflowDeliveryIn,
    plan: DeliveryPlan,
    fetched: FetchedVersion | None,
    *,
    actor: str,
) -> MlflowDeliveryRecord:
    """Remember the delivery id and, for ``register``, add the fetched files as the lineage's
    version — one transaction, so a concurrent replay of the same id (unique column) rolls
    the whole thing back instead of registering twice."""
    lock_writes(session)
    if session.scalar(select(MlflowDelivery.id).where(MlflowDelivery.delivery_id == d.delivery_id)):
        raise Conflict("delivery id already acted on", field="delivery_id")
    outcome: dict[str, Any] = {"action": plan.action, "reason": plan.reason}
    if plan.action == "register":
        assert fetched is not None and plan.lineage and plan.role
        model_uri = f"models:/{plan.registered_model}/{plan.version}"
        mlflow_facts = {
            "tracking_uri": fetched.tracking_uri,
            "registered_model": plan.registered_model,
            "version": plan.version,
            "alias": plan.alias,
            "source": fetched.source,
            "run_id": fetched.run_id,
            "delivery_id": d.delivery_id,
            "event": d.event,
        }
        added = add_artifact(
            session,
            source=str(fetched.directory),
            name=plan.lineage,
            role=plan.role,  # type: ignore[arg-type]
            provenance=Provenance(source_url=model_uri, attestations={"mlflow": mlflow_facts}),
            actor=actor,
        )
        outcome = {
            "action": "registered" if added.created else "unchanged",
            "reason": "" if added.created else "identical content is already registered",
            "lineage": plan.lineage,
            "artifact_id": added.artifact.id,
            "artifact_version": added.artifact.version,
            "manifest_digest": added.artifact.manifest_digest,
            "target_changed": added.target_changed,
            "model_uri": model_uri,
            "alias": plan.alias,
        }
    row = MlflowDelivery(delivery_id=d.delivery_id, event=d.event, outcome=outcome)
    session.add(row)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="mlflow.delivery",
        entity_type="mlflow_delivery",
        entity_id=d.delivery_id,
        payload={"event": d.event, **outcome},
    )
    return from_row(MlflowDeliveryRecord, row)
