"""Deployments: named aliases that serve one pair, moved only by promote and rollback.

Every move is a ``deployment_events`` row (seq = the deployment's new version) and an audit
event in the same transaction, so "which pair served deployment D at time T" is a lookup
(:func:`pair_live_at`). At most one pair is live per deployment by construction
(``deployments.current_pair_id``), and a move is a compare-and-set on
``deployments.version``: two promoters racing from the same version cannot both commit.

Status rules: the pair made live becomes ``promoted``; the pair it replaces goes back to
``validated`` unless it is still live in another deployment.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from registry.errors import Conflict, Forbidden, InvalidInput, NotFound
from registry.governance import lifecycle
from registry.governance.policy import section, settings_digest
from registry.governance.timeline import live_event
from registry.params import (
    Cursor,
    DeploymentName,
    ExpectVersion,
    Limit,
    PolicyName,
    Reason,
    Timestamp,
)
from registry.records.core import Page
from registry.records.governance import (
    DeploymentEventRecord,
    DeploymentRecord,
    GateResult,
    PromoteResult,
)
from registry.refs import deployment_named, resolve_deployment, resolve_pair
from registry.services.base import page_query
from registry.services.policies import load_policy
from registry.services.validation import baseline_measurement, evaluate_gates, policy_settings
from registry.tables import Deployment, DeploymentEvent, Measurement, Pair, Validation, utcnow
from registry.trust.audit import append_event, lock_writes


def _check_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > 100 or any(c.isspace() for c in name) or "/" in name:
        raise InvalidInput(
            "deployment name must be 1-100 characters without spaces or '/'", field="name"
        )
    return name


def _check_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required", field="reason")
    return reason[:2000]


def _digests(session: Session, ids: set[int | None]) -> dict[int, str]:
    wanted = {i for i in ids if i is not None}
    if not wanted:
        return {}
    return {p.id: p.pair_digest for p in session.scalars(select(Pair).where(Pair.id.in_(wanted)))}


def event_record(ev: DeploymentEvent, digests: dict[int, str]) -> DeploymentEventRecord:
    return DeploymentEventRecord(
        seq=ev.seq,
        action=ev.action,  # type: ignore[arg-type]
        from_pair_id=ev.from_pair_id,
        from_pair_digest=digests.get(ev.from_pair_id) if ev.from_pair_id else None,
        to_pair_id=ev.to_pair_id,
        to_pair_digest=digests.get(ev.to_pair_id) if ev.to_pair_id else None,
        validation_id=ev.validation_id,
        actor=ev.actor,
        reason=ev.reason,
        at=ev.at,
    )


def history(session: Session, dep: Deployment) -> list[DeploymentEvent]:
    return list(
        session.scalars(
            select(DeploymentEvent)
            .where(DeploymentEvent.deployment_id == dep.id)
            .order_by(DeploymentEvent.seq)
        )
    )


def to_record(session: Session, dep: Deployment, *, with_history: bool = False) -> DeploymentRecord:
    events = history(session, dep) if with_history else []
    ids: set[int | None] = {dep.current_pair_id}
    for ev in events:
        ids.update((ev.from_pair_id, ev.to_pair_id))
    digests = _digests(session, ids)
    return DeploymentRecord(
        id=dep.id,
        name=dep.name,
        policy_name=dep.policy_name,
        current_pair_id=dep.current_pair_id,
        current_pair_digest=digests.get(dep.current_pair_id) if dep.current_pair_id else None,
        version=dep.version,
        created_by=dep.created_by,
        created_at=dep.created_at,
        updated_at=dep.updated_at,
        history=[event_record(ev, digests) for ev in events] if with_history else None,
    )


def pair_live_at(session: Session, deployment: str, at: datetime) -> Pair | None:
    """The pair deployment ``deployment`` served at instant ``at`` (None before the first
    promotion, or for an unknown deployment). A move takes effect at its event time
    (``registry.governance.timeline``: the rule ingest and request audits use too)."""
    if at.tzinfo is None:
        raise InvalidInput("time must carry a timezone", field="at")
    dep = deployment_named(session, deployment)
    if dep is None:
        return None
    ev = live_event(session, dep.id, at)
    if ev is None or ev.to_pair_id is None:
        return None
    return session.get(Pair, ev.to_pair_id)


def create_deployment(
    session: Session, *, name: DeploymentName, policy: PolicyName = "default", actor: str
) -> DeploymentRecord:
    name = _check_name(name)
    lock_writes(session)
    pol = load_policy(session, policy, actor=actor)
    if deployment_named(session, name) is not None:
        raise Conflict(f"deployment {name} already exists", field="name")
    dep = Deployment(name=name, policy_name=pol.name, version=0, created_by=actor)
    session.add(dep)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="deployment.created",
        entity_type="deployment",
        entity_id=name,
        payload={"name": name, "policy": pol.name},
    )
    return to_record(session, dep, with_history=True)


def set_deployment_policy(
    session: Session, *, name: str, policy: PolicyName, actor: str
) -> DeploymentRecord:
    lock_writes(session)
    dep = resolve_deployment(session, name)
    pol = load_policy(session, policy, actor=actor)
    old = dep.policy_name
    dep.policy_name = pol.name
    dep.updated_at = utcnow()
    append_event(
        session,
        actor=actor,
        action="deployment.policy_changed",
        entity_type="deployment",
        entity_id=name,
        payload={"from": old, "to": pol.name},
    )
    return to_record(session, dep, with_history=True)


def get_deployment(session: Session, *, name: str) -> DeploymentRecord:
    return to_record(session, resolve_deployment(session, name), with_history=True)


def list_deployments(
    session: Session, *, cursor: Cursor = None, limit: Limit = 100
) -> Page[DeploymentRecord]:
    rows, next_cursor = page_query(session, select(Deployment), Deployment.id, cursor, limit)
    return Page[DeploymentRecord](
        items=[to_record(session, d) for d in rows], next_cursor=next_cursor
    )


def deployment_at(session: Session, *, name: str, at: Timestamp) -> DeploymentEventRecord | None:
    """The move that was in force on ``name`` at ``at`` (None before the first one)."""
    dep = resolve_deployment(session, name)
    if at.tzinfo is None:
        raise InvalidInput("time must carry a timezone", field="at")
    ev = session.scalar(
        select(DeploymentEvent)
        .where(DeploymentEvent.deployment_id == dep.id, DeploymentEvent.at <= at)
        .order_by(DeploymentEvent.seq.desc())
        .limit(1)
    )
    if ev is None:
        return None
    return event_record(ev, _digests(session, {ev.from_pair_id, ev.to_pair_id}))


def _move(
    session: Session,
    dep: Deployment,
    *,
    action: str,
    to_pair: Pair,
    reason: str,
    validation_id: int | None,
    expect_version: int | None,
    actor: str,
    extra_payload: dict[str, Any] | None = None,
) -> DeploymentEvent:
    """Compare-and-set the live pair, append its event, fix statuses; one transaction."""
    seen = dep.version
    if expect_version is not None and expect_version != seen:
        raise Conflict(
            f"deployment {dep.name} is at version {seen}, not {expect_version}: "
            "it moved since you looked",
            field="expect_version",
        )
    from_pair_id = dep.current_pair_id
    now = utcnow()
    moved = session.execute(
        update(Deployment)
        .where(Deployment.id == dep.id, Deployment.version == seen)
        .values(current_pair_id=to_pair.id, version=seen + 1, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if moved.rowcount != 1:
        raise Conflict(f"deployment {dep.name} moved concurrently: retry", field="deployment")
    session.refresh(dep)
    ev = DeploymentEvent(
        deployment_id=dep.id,
        seq=seen + 1,
        action=action,
        from_pair_id=from_pair_id,
        to_pair_id=to_pair.id,
        validation_id=validation_id,
        actor=actor,
        reason=reason,
        at=now,
    )
    session.add(ev)
    session.flush()
    lifecycle.apply(
        session,
        to_pair,
        "rolled_back_to" if action == "rollback" else "promoted",
        actor=actor,
        reason=f"{action} on deployment {dep.name}",
    )
    if from_pair_id is not None and from_pair_id != to_pair.id:
        still_live = session.scalar(
            select(func.count())
            .select_from(Deployment)
            .where(Deployment.current_pair_id == from_pair_id)
        )
        old = session.get(Pair, from_pair_id)
        if old is not None and not still_live and old.status == "promoted":
            lifecycle.apply(
                session, old, "replaced", actor=actor, reason=f"replaced on deployment {dep.name}"
            )
    digests = _digests(session, {from_pair_id, to_pair.id})
    append_event(
        session,
        actor=actor,
        action=f"deployment.{action}",
        entity_type="deployment",
        entity_id=dep.name,
        payload={
            "seq": ev.seq,
            "from_pair": digests.get(from_pair_id) if from_pair_id else None,
            "to_pair": to_pair.pair_digest,
            "reason": reason,
            "validation_id": validation_id,
            **(extra_payload or {}),
        },
    )
    return ev


FOUR_EYES_RULE = "governance.distinct_actors"


def check_distinct_actors(
    session: Session, pair: Pair, dep: Deployment, actor: str
) -> dict[str, Any] | None:
    """Four-eyes, when the deployment's policy sets ``[governance] distinct_actors``: the
    actor that registered the pair, or stored the policy version in force, cannot promote
    it. Refused with a 403 naming the rule, and the refusal is audited
    (``deployment.promote_refused``); allowed promotions record who was distinct."""
    pol = load_policy(session, dep.policy_name)
    if not section(pol.parsed, "governance")["distinct_actors"]:
        return None
    roles_held = {"registered the pair": pair.registered_by, "authored the policy": pol.created_by}
    clashes = [what for what, who in roles_held.items() if who == actor]
    if clashes:
        raise Forbidden(
            f"{FOUR_EYES_RULE}: policy {pol.name} v{pol.version} requires another actor to "
            f"promote: {actor} " + " and ".join(clashes),
            field="ref",
            details={"rule": FOUR_EYES_RULE, "policy": pol.name, "clashes": clashes},
            audit_event={
                "actor": actor,
                "action": "deployment.promote_refused",
                "entity_type": "deployment",
                "entity_id": dep.name,
                "payload": {
                    "rule": FOUR_EYES_RULE,
                    "pair": pair.pair_digest,
                    "policy": pol.name,
                    "policy_version": pol.version,
                    "clashes": clashes,
                },
            },
        )
    return {
        "rule": FOUR_EYES_RULE,
        "policy_version": pol.version,
        "registered_by": pair.registered_by,
        "policy_by": pol.created_by,
    }


def promotion_gates(
    session: Session, pair: Pair, dep: Deployment, home_dir: str | None = None
) -> tuple[list[GateResult], Validation | None, list[str]]:
    """Re-check a pair for a deployment as things stand now: (gates, validation, refusals)."""
    pol = load_policy(session, dep.policy_name)
    val = session.scalar(
        select(Validation)
        .where(Validation.pair_id == pair.id, Validation.policy_name == pol.name)
        .order_by(Validation.id.desc())
        .limit(1)
    )
    if val is None:
        others = sorted(
            set(
                session.scalars(
                    select(Validation.policy_name).where(
                        Validation.pair_id == pair.id, Validation.passed.is_(True)
                    )
                )
            )
        )
        where = f" (validated under {', '.join(others)} only)" if others else ""
        return (
            [],
            None,
            [
                f"pair is not validated under policy {pol.name}{where}: "
                f"run `pairreg validate {pair.pair_digest[:12]} --deployment {dep.name}`"
            ],
        )
    m = session.get(Measurement, val.measurement_id) if val.measurement_id else None
    if m is None:
        return [], val, [f"validation {val.id} has no measurement"]
    wanted = settings_digest(policy_settings(session, pair, pol))
    if m.settings_digest != wanted or m.suite_name != pol.parsed["suite"]["name"]:
        return (
            [],
            val,
            [f"policy {pol.name} changed its suite since validation {val.id}: validate again"],
        )
    gates = evaluate_gates(
        session,
        pair,
        pol,
        m,
        baseline=baseline_measurement(session, dep, pair, pol),
        home_dir=home_dir,
    )
    refusals = [
        f"gate {g.name}: required {g.required}, measured {g.measured}"
        + (f" ({g.detail})" if g.detail else "")
        for g in gates
        if not g.passed
    ]
    return gates, val, refusals


def promote(
    session: Session,
    *,
    ref: Annotated[str, Field(min_length=1, description="Pair id or digest prefix.")],
    deployment: str,
    reason: Reason,
    create: Annotated[bool, Field(description="Create the deployment if missing.")] = False,
    expect_version: ExpectVersion = None,
    actor: str,
    home_dir: str | None = None,
) -> PromoteResult:
    """Make ``ref`` the live pair of ``deployment`` if every gate passes right now
    (``home_dir``, from the operation's context, holds the economics gates' profiles)."""
    reason = _check_reason(reason)
    lock_writes(session)
    pair = resolve_pair(session, ref)
    dep = deployment_named(session, deployment, lock=True)
    if dep is None:
        if not create:
            raise NotFound(
                f"no deployment named {deployment}: create it first (`pairreg deployment create`)",
                field="deployment",
            )
        create_deployment(session, name=deployment, actor=actor)
        dep = resolve_deployment(session, deployment)
    if dep.current_pair_id == pair.id:
        raise Conflict(f"pair {pair.pair_digest[:12]} is already live on {dep.name}", field="ref")
    four_eyes = check_distinct_actors(session, pair, dep, actor)
    gates, val, refusals = promotion_gates(session, pair, dep, home_dir)
    if refusals:
        raise Conflict(
            f"promotion of {pair.pair_digest[:12]} to {dep.name} refused: " + "; ".join(refusals),
            field="ref",
            details={"refusals": refusals, "gates": [g.model_dump() for g in gates]},
        )
    ev = _move(
        session,
        dep,
        action="promote",
        to_pair=pair,
        reason=reason,
        validation_id=val.id if val else None,
        expect_version=expect_version,
        actor=actor,
        extra_payload={"four_eyes": four_eyes} if four_eyes else None,
    )
    digests = _digests(session, {ev.from_pair_id, ev.to_pair_id})
    return PromoteResult(
        deployment=to_record(session, dep, with_history=True),
        event=event_record(ev, digests),
        gates=gates,
    )


def live_stack(events: list[DeploymentEvent]) -> list[int]:
    """Pairs in the order they were promoted, minus those rolled back: a rollback pops the
    live pair, so rolling back twice walks two promotions back rather than toggling."""
    stack: list[int] = []
    for ev in events:
        if ev.action == "rollback":
            if stack:
                stack.pop()
        elif ev.to_pair_id is not None:
            stack.append(ev.to_pair_id)
    return stack


def rollback(
    session: Session,
    *,
    deployment: str,
    reason: Reason,
    expect_version: ExpectVersion = None,
    actor: str,
) -> PromoteResult:
    """Return to the pair that was live before the current one.

    Rolling back is the emergency exit, so gates are not re-checked; the previous pair was
    gated when it was promoted, and the move is recorded with its reason like any other.
    """
    reason = _check_reason(reason)
    lock_writes(session)
    dep = resolve_deployment(session, deployment, lock=True)
    stack = live_stack(history(session, dep))
    if len(stack) < 2:
        raise Conflict(
            f"deployment {dep.name} has no previous pair to roll back to", field="deployment"
        )
    previous = session.get(Pair, stack[-2])
    assert previous is not None
    ev = _move(
        session,
        dep,
        action="rollback",
        to_pair=previous,
        reason=reason,
        validation_id=None,
        expect_version=expect_version,
        actor=actor,
    )
    digests = _digests(session, {ev.from_pair_id, ev.to_pair_id})
    return PromoteResult(
        deployment=to_record(session, dep, with_history=True), event=event_record(ev, digests)
    )
