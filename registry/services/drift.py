"""Target change → candidate pairs → measurement → drift flag, plus integrity flags.

When a new version lands in a lineage that is the target of a validated or promoted pair,
each such pair gets a *candidate*: same drafter and config, the new target. Its measurement
is queued with the baseline's suite and settings; when the worker hands the numbers back,
:func:`compare_for_drift` tests every category on the same prompts
(:mod:`registry.stats.drift`) and opens a flag when a drop is both larger than the policy's
margin and significant after Holm correction. An open flag blocks promotion (the ``flags``
gate) until it is acknowledged with a reason, or resolved (a retrained drafter for the same
target passed validation, or a person resolved it). A changed file found by
``artifact verify`` opens an ``integrity`` flag on that artifact, which blocks every pair
that uses it.

Status: a candidate with an open drift flag becomes ``drifted``; acknowledging the flag
returns it to ``validated`` when its latest validation's gates now pass, else ``registered``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.errors import Conflict, InvalidInput, NotFound, PairregError
from registry.governance import lifecycle
from registry.params import Cursor, Id, Limit, PolicyName, Reason
from registry.records.core import Page, VerifyReport, from_row
from registry.records.governance import DriftCheckResult, DriftFlagRecord
from registry.refs import resolve_pair
from registry.services import artifacts as artifacts_service
from registry.services import jobs as jobs_service
from registry.services.base import page_query
from registry.services.pairs import create_pair_row, head_fit_errors
from registry.services.policies import load_policy
from registry.stats.drift import drift_test, severity
from registry.tables import Artifact, DriftFlag, Measurement, Pair, Validation, utcnow
from registry.trust.audit import append_event, lock_writes

FLAG_STATES = ("open", "acknowledged", "resolved")
FLAG_KINDS = ("drift", "integrity", "workload", "serving")


def to_record(flag: DriftFlag, pair_digest: str | None) -> DriftFlagRecord:
    return from_row(DriftFlagRecord, flag, pair_digest=pair_digest)


def _record(session: Session, flag: DriftFlag) -> DriftFlagRecord:
    pair = session.get(Pair, flag.pair_id) if flag.pair_id else None
    return to_record(flag, pair.pair_digest if pair else None)


# --- target change -------------------------------------------------------------------


def _baselines(session: Session, pair: Pair) -> list[Validation]:
    """The latest passing validation per policy: what the candidate is compared against."""
    rows = session.scalars(
        select(Validation)
        .where(Validation.pair_id == pair.id, Validation.passed.is_(True))
        .order_by(Validation.id.desc())
    )
    latest: dict[str, Validation] = {}
    for v in rows:
        if v.measurement_id is not None:
            latest.setdefault(v.policy_name, v)
    return list(latest.values())


def on_target_change(session: Session, previous: Artifact, new: Artifact, actor: str) -> None:
    """Create candidate pairs for validated/promoted pairs of this lineage; queue them."""
    lineage_targets = select(Artifact.id).where(
        Artifact.lineage == new.lineage, Artifact.id != new.id
    )
    pairs = session.scalars(
        select(Pair)
        .where(Pair.target_id.in_(lineage_targets), Pair.status.in_(("validated", "promoted")))
        .order_by(Pair.id)
    ).all()
    for base in pairs:
        try:
            cand, _ = create_pair_row(
                session,
                target=new,
                drafter=base.drafter,
                config=dict(base.config),
                strict=False,
                actor=actor,
                extra_payload={"candidate_of": base.pair_digest, "reason": "target changed"},
            )
        except PairregError as exc:
            append_event(
                session,
                actor=actor,
                action="drift.candidate_refused",
                entity_type="pair",
                entity_id=base.id,
                payload={"pair_digest": base.pair_digest, "new_target": new.id, "error": str(exc)},
            )
            _head_no_longer_fits(session, base, new, actor)
            continue
        for val in _baselines(session, base):
            bm = session.get(Measurement, val.measurement_id)
            assert bm is not None
            args = {
                "pair_id": cand.id,
                "pair_digest": cand.pair_digest,
                "suite_name": bm.suite_name,
                "categories": sorted(bm.categories),
                "prompts_per_category": int((bm.extra or {}).get("prompts_per_category", 0)),
                "settings": bm.settings,
                "runner_version": None,
                "suite_digest": bm.suite_digest,
                "policy": val.policy_name,
                "validate": None,
                "drift": {
                    "baseline_pair_id": base.id,
                    "baseline_measurement_id": bm.id,
                    "previous_target_id": base.target_id,
                    "new_target_id": new.id,
                },
            }
            key = {
                "pair": cand.pair_digest,
                "baseline_measurement": bm.id,
                "policy": val.policy_name,
                "purpose": "drift",
            }
            jobs_service.enqueue_remeasure(
                session,
                args=args,
                key_material=key,
                actor=actor,
                action="drift.remeasure_queued",
                pair_id=cand.id,
                payload={
                    "candidate": cand.pair_digest,
                    "baseline": base.pair_digest,
                    "policy": val.policy_name,
                },
            )


def _head_no_longer_fits(session: Session, base: Pair, new: Artifact, actor: str) -> None:
    """A target change the pair's heads cannot follow (hidden size, vocabulary, the layers
    an EAGLE-3 head reads) is an integrity finding on the pair: there is nothing to
    measure, the heads must be retrained for the new target."""
    if base.drafter is None:
        return
    reasons = head_fit_errors(new.facts or {}, base.drafter.facts or {}, base.method)
    if not reasons:
        return
    summary = (
        f"target {new.lineage}@v{new.version} no longer fits the {base.method} heads "
        f"{base.drafter.lineage}@v{base.drafter.version}: " + "; ".join(reasons)
    )
    _open_integrity_once(
        session,
        DriftFlag.pair_id == base.id,
        DriftFlag(
            kind="integrity",
            pair_id=base.id,
            effects={
                "reasons": reasons,
                "new_target_id": new.id,
                "new_target_manifest_digest": new.manifest_digest,
                "drafter_id": base.drafter.id,
            },
            severity="high",
            summary=summary,
        ),
        actor=actor,
        payload={"pair_digest": base.pair_digest, "new_target": new.id, "summary": summary},
    )


def compare_for_drift(
    session: Session,
    *,
    candidate: Pair,
    candidate_measurement: Measurement,
    baseline_measurement_id: int,
    policy_name: str,
    teacher_forced: dict[str, Any] | None,
    actor: str,
) -> DriftCheckResult:
    """Paired per-category test of candidate vs baseline; open a flag on a real drop."""
    base = session.get(Measurement, baseline_measurement_id)
    if base is None:
        raise NotFound(f"no baseline measurement {baseline_measurement_id}")
    pol = load_policy(session, policy_name, actor=actor)
    d = pol.parsed["drift"]
    effects = drift_test(
        base.prompts,
        candidate_measurement.prompts,
        margin=d["margin"],
        significance=d["significance"],
        n_boot=int(d["bootstrap"]),
    )
    payload: dict[str, Any] = {
        "categories": {c: e.to_dict() for c, e in effects.items()},
        "margin": d["margin"],
        "significance": d["significance"],
        "baseline_alpha": base.alpha,
        "candidate_alpha": candidate_measurement.alpha,
    }
    if teacher_forced:
        payload["teacher_forced"] = teacher_forced
    drifted = {c: e for c, e in effects.items() if e.drifted}
    flag = None
    if drifted:
        summary = "; ".join(
            f"{c}: α {e.baseline_alpha:.3f} → {e.candidate_alpha:.3f} "
            f"({e.diff:+.3f}, 95% CI [{e.ci_low:+.3f}, {e.ci_high:+.3f}], "
            f"Holm p={e.p_holm:.4f})"
            for c, e in drifted.items()
        )
        flag = open_flag(
            session,
            DriftFlag(
                kind="drift",
                pair_id=candidate.id,
                baseline_pair_id=base.pair_id,
                baseline_measurement_id=base.id,
                candidate_measurement_id=candidate_measurement.id,
                policy_name=pol.name,
                effects=payload,
                severity=severity(effects, d["margin"]),
                summary=summary,
            ),
            actor=actor,
            payload={
                "pair_digest": candidate.pair_digest,
                "severity": severity(effects, d["margin"]),
                "summary": summary,
                "baseline_measurement_id": base.id,
                "candidate_measurement_id": candidate_measurement.id,
            },
        )
        lifecycle.apply(
            session, candidate, "drift_flagged", actor=actor, reason=f"drift flag {flag.id} opened"
        )
    else:
        append_event(
            session,
            actor=actor,
            action="drift.clean",
            entity_type="pair",
            entity_id=candidate.id,
            payload={
                "pair_digest": candidate.pair_digest,
                "baseline_measurement_id": base.id,
                "candidate_measurement_id": candidate_measurement.id,
                "diffs": {c: e.diff for c, e in effects.items()},
            },
        )
    return DriftCheckResult(
        candidate_pair_id=candidate.id,
        baseline_pair_id=base.pair_id,
        baseline_measurement_id=base.id,
        candidate_measurement_id=candidate_measurement.id,
        effects=payload,
        flagged=flag is not None,
        flag=_record(session, flag) if flag else None,
    )


def check_drift(
    session: Session,
    *,
    candidate: Annotated[str, Field(min_length=1, description="Pair id or digest prefix.")],
    baseline_measurement: Id,
    candidate_measurement: Id,
    policy: PolicyName = "default",
    actor: str,
) -> DriftCheckResult:
    """Compare two stored measurements by hand (same comparison the worker runs)."""
    pair = resolve_pair(session, candidate, field="candidate")
    cm = session.get(Measurement, candidate_measurement)
    if cm is None or cm.pair_id != pair.id:
        raise InvalidInput(
            f"measurement {candidate_measurement} is not of pair {candidate}",
            field="candidate_measurement",
        )
    lock_writes(session)
    return compare_for_drift(
        session,
        candidate=pair,
        candidate_measurement=cm,
        baseline_measurement_id=baseline_measurement,
        policy_name=policy,
        teacher_forced=None,
        actor=actor,
    )


# --- integrity -----------------------------------------------------------------------


def on_verify(session: Session, art: Artifact, report: VerifyReport, actor: str) -> None:
    """Changed, missing or added files on a registered artifact open an integrity flag."""
    if report.ok:
        return
    parts = [
        f"{len(v)} {k} ({', '.join(v[:5])}{', …' if len(v) > 5 else ''})"
        for k, v in (
            ("changed", report.changed),
            ("missing", report.missing),
            ("added", report.added),
        )
        if v
    ]
    summary = f"{art.lineage}@v{art.version} at {report.path}: " + "; ".join(parts)
    _open_integrity_once(
        session,
        DriftFlag.artifact_id == art.id,
        DriftFlag(
            kind="integrity",
            artifact_id=art.id,
            effects={
                "changed": report.changed,
                "missing": report.missing,
                "added": report.added,
                "path": report.path,
                "manifest_digest": report.manifest_digest,
            },
            severity="high",
            summary=summary,
        ),
        actor=actor,
        payload={"artifact_id": art.id, "summary": summary},
    )


def _open_integrity_once(
    session: Session, subject: Any, flag: DriftFlag, *, actor: str, payload: dict[str, Any]
) -> None:
    """Open an integrity flag unless one with the same summary is already open for the same
    subject (``subject`` is the column test naming the pair or artifact): re-running a
    check must not stack duplicate flags."""
    lock_writes(session)
    existing = session.scalar(
        select(DriftFlag).where(
            DriftFlag.kind == "integrity",
            subject,
            DriftFlag.state == "open",
            DriftFlag.summary == flag.summary,
        )
    )
    if existing is None:
        open_flag(session, flag, actor=actor, payload=payload)


def open_flag(
    session: Session, flag: DriftFlag, *, actor: str, payload: dict[str, Any]
) -> DriftFlag:
    """Open a drift, integrity or workload flag with its audit event (one way for all)."""
    flag.state = "open"
    flag.opened_by = actor
    session.add(flag)
    session.flush()
    append_event(
        session,
        actor=actor,
        action=f"{flag.kind}.flag_opened",
        entity_type="drift_flag",
        entity_id=flag.id,
        payload=payload,
    )
    return flag


# --- reading and closing flags ---------------------------------------------------------


def flags_open_at(session: Session, pair_id: int, at: Any) -> list[DriftFlag]:
    """Flags on a pair that were open at instant ``at`` (for request audits)."""
    stmt = select(DriftFlag).where(
        DriftFlag.pair_id == pair_id,
        DriftFlag.opened_at <= at,
        (DriftFlag.closed_at.is_(None)) | (DriftFlag.closed_at > at),
    )
    return list(session.scalars(stmt.order_by(DriftFlag.id)))


def list_flags(
    session: Session,
    *,
    state: str | None = None,
    kind: str | None = None,
    pair: str | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
) -> Page[DriftFlagRecord]:
    stmt = select(DriftFlag)
    if state:
        if state not in FLAG_STATES:
            raise InvalidInput(f"state must be one of {', '.join(FLAG_STATES)}", field="state")
        stmt = stmt.where(DriftFlag.state == state)
    if kind:
        if kind not in FLAG_KINDS:
            raise InvalidInput(f"kind must be one of {', '.join(FLAG_KINDS)}", field="kind")
        stmt = stmt.where(DriftFlag.kind == kind)
    if pair:
        stmt = stmt.where(DriftFlag.pair_id == resolve_pair(session, pair).id)
    rows, next_cursor = page_query(session, stmt, DriftFlag.id, cursor, limit)
    return Page[DriftFlagRecord](items=[_record(session, f) for f in rows], next_cursor=next_cursor)


def _flag(session: Session, id: int) -> DriftFlag:
    flag = session.get(DriftFlag, id)
    if flag is None:
        raise NotFound(f"no drift flag with id {id}", field="id")
    return flag


def get_flag(session: Session, *, id: Id) -> DriftFlagRecord:
    return _record(session, _flag(session, id))


def _after_close(
    session: Session, flag: DriftFlag, actor: str, home_dir: str | None = None
) -> None:
    """A candidate whose last open flag closed leaves ``drifted``."""
    if flag.pair_id is None:
        return
    pair = session.get(Pair, flag.pair_id)
    if pair is None or pair.status != "drifted":
        return
    still_open = session.scalar(
        select(DriftFlag.id).where(DriftFlag.pair_id == pair.id, DriftFlag.state == "open").limit(1)
    )
    if still_open is not None:
        return
    from registry.services.validation import evaluate_gates  # validation imports this module

    event = "flags_cleared"
    val = session.scalar(
        select(Validation)
        .where(Validation.pair_id == pair.id)
        .order_by(Validation.id.desc())
        .limit(1)
    )
    if val is not None and val.measurement_id is not None:
        m = session.get(Measurement, val.measurement_id)
        pol = load_policy(session, val.policy_name, actor=actor)
        if m is not None and all(
            g.passed for g in evaluate_gates(session, pair, pol, m, home_dir=home_dir)
        ):
            event = "flags_cleared_valid"
    lifecycle.apply(session, pair, event, actor=actor, reason=f"flag {flag.id} {flag.state}")


def _close(
    session: Session, id: int, state: str, reason: str, actor: str, home_dir: str | None
) -> DriftFlagRecord:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required", field="reason")
    lock_writes(session)
    flag = _flag(session, id)
    if flag.state != "open" and not (state == "resolved" and flag.state == "acknowledged"):
        raise Conflict(f"flag {id} is {flag.state}", field="id")
    old = flag.state
    flag.state = state
    flag.reason = reason[:2000]
    flag.closed_by = actor
    flag.closed_at = utcnow()
    session.flush()
    append_event(
        session,
        actor=actor,
        action=f"drift.flag_{state}",
        entity_type="drift_flag",
        entity_id=flag.id,
        payload={
            "from": old,
            "to": state,
            "reason": flag.reason,
            "kind": flag.kind,
            "pair_id": flag.pair_id,
            "artifact_id": flag.artifact_id,
        },
    )
    _after_close(session, flag, actor, home_dir)
    return _record(session, flag)


def ack_flag(
    session: Session, *, id: Id, reason: Reason, actor: str, home_dir: str | None = None
) -> DriftFlagRecord:
    """Accept an open flag with a reason: it no longer blocks promotion. (``home_dir``,
    from the operation's context: the profiles a pair's gates are re-checked on.)"""
    return _close(session, id, "acknowledged", reason, actor, home_dir)


def resolve_flag(
    session: Session, *, id: Id, reason: Reason, actor: str, home_dir: str | None = None
) -> DriftFlagRecord:
    """Close a flag because its cause is fixed (e.g. a retrained drafter was validated).
    (``home_dir`` as for :func:`ack_flag`.)"""
    return _close(session, id, "resolved", reason, actor, home_dir)


def resolve_by_retrained(
    session: Session, pair: Pair, validation_id: int, actor: str, home_dir: str | None
) -> None:
    """A pair passed validation: flags on candidates with the same target whose drafter is
    an older version of this pair's drafter are resolved (the retrained drafter fixed it).
    (``home_dir``: the validation's, for the gates re-checked as the flags close.)"""
    if pair.drafter is None:
        return
    older = select(Artifact.id).where(
        Artifact.lineage == pair.drafter.lineage, Artifact.id != pair.drafter.id
    )
    stale = select(Pair.id).where(Pair.target_id == pair.target_id, Pair.drafter_id.in_(older))
    flags = session.scalars(
        select(DriftFlag).where(
            DriftFlag.kind == "drift",
            DriftFlag.state.in_(("open", "acknowledged")),
            DriftFlag.pair_id.in_(stale),
        )
    ).all()
    for flag in flags:
        _close(
            session,
            flag.id,
            "resolved",
            f"retrained drafter validated: pair {pair.pair_digest[:12]} "
            f"(validation {validation_id})",
            actor,
            home_dir,
        )


artifacts_service.TARGET_CHANGE_LISTENERS.append(on_target_change)
artifacts_service.VERIFY_LISTENERS.append(on_verify)
