"""Acceptance curves as a record others can replay.

Export: a pair's acceptance length for k = 1..8 per category, from one measurement
(exact up to the measured k, extrapolated beyond and marked: ``registry.economics.schedule``),
with its provenance (pair digest, suite digest, engine and version, the sampling settings)
and, per point, the ``synthetic_acceptance_rates`` vLLM's synthetic rejection sampler takes
(``rejection_sample_method: "synthetic"``), so a benchmark harness can serve any engine
build at this pair's acceptance without its weights.

Import refuses a curve whose provenance does not match a registered pair (unknown pair
digest, a settings digest that does not match its settings, a measured k beyond the pair's
k, another acceptance rule or method than the pair's) or whose numbers do not add up
(rates outside [0, 1], increasing, or an acceptance length that is not 1 + their sum).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.canonical import canonical_json, sha256_hex
from registry.economics import schedule as ks
from registry.errors import Conflict, InvalidInput, NotFound
from registry.governance.policy import settings_digest
from registry.records.lifecycle import (
    AcceptanceCurve,
    CurveImportResult,
    CurvePoint,
    CurveProvenance,
)
from registry.refs import resolve_pair
from registry.tables import AcceptanceCurveRow, Measurement, Pair
from registry.trust.audit import append_event, lock_writes

FORMAT = "pairreg-acceptance-curve/1"
TOLERANCE = 1e-6


def _points(group: dict[str, Any], k_max: int) -> list[CurvePoint] | None:
    per_pos = [p for p in (group.get("per_position") or []) if p is not None]
    if not per_pos:
        return None
    lengths = ks.acceptance_lengths(
        per_pos, list(group.get("per_position_conditional") or []), k_max
    )
    reach = [lengths[i].length - lengths[i - 1].length for i in range(1, len(lengths))]
    return [
        CurvePoint(
            k=a.k,
            acceptance_length=a.length,
            source=a.source,
            synthetic_acceptance_rates=[min(1.0, max(0.0, r)) for r in reach[: a.k]],
        )
        for a in lengths[1:]
    ]


def export_acceptance_curve(
    session: Session,
    *,
    pair: Annotated[str, Field(min_length=1, description="Pair id or digest prefix.")],
    measurement: Annotated[
        int | None, Field(ge=1, description="Measurement id (default: the pair's latest).")
    ] = None,
    k_max: Annotated[int, Field(ge=1, le=16)] = ks.K_MAX,
) -> AcceptanceCurve:
    """A pair's acceptance length per k per category, with its provenance, replayable
    through vLLM's synthetic rejection sampler."""
    p = resolve_pair(session, pair)
    stmt = select(Measurement).where(Measurement.pair_id == p.id)
    if measurement is not None:
        stmt = stmt.where(Measurement.id == measurement)
    m = session.scalar(stmt.order_by(Measurement.id.desc()).limit(1))
    if m is None:
        raise NotFound(f"pair {p.pair_digest[:12]} has no such measurement", field="measurement")
    curves: dict[str, list[CurvePoint]] = {}
    overall = _points(m.overall or {}, k_max)
    if overall is None:
        raise InvalidInput(
            f"measurement {m.id} has no per-position acceptance to build a curve from",
            field="measurement",
        )
    curves["overall"] = overall
    for cat, group in sorted((m.categories or {}).items()):
        pts = _points(group or {}, k_max)
        if pts is not None:
            curves[cat] = pts
    measured_k = int((m.settings or {}).get("k") or p.k)
    at_k = overall[min(measured_k, k_max) - 1]
    return AcceptanceCurve(
        format=FORMAT,
        provenance=CurveProvenance(
            pair_digest=p.pair_digest,
            suite_name=m.suite_name,
            suite_digest=m.suite_digest,
            engine=str((m.extra or {}).get("engine") or "pairreg-runner"),
            engine_version=m.runner_version,
            sampling=dict(m.settings or {}),
            settings_digest=m.settings_digest,
            measured_k=measured_k,
            measurement_id=m.id,
        ),
        curves=curves,
        vllm_replay={
            "num_speculative_tokens": at_k.k,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": at_k.synthetic_acceptance_rates,
        },
    )


def _check_numbers(curve: AcceptanceCurve) -> None:
    if "overall" not in curve.curves:
        raise InvalidInput("curves must include 'overall'", field="curves")
    for cat, points in curve.curves.items():
        ks_seen = [pt.k for pt in points]
        if ks_seen != list(range(1, len(points) + 1)):
            raise InvalidInput(f"curves.{cat}: k must run 1, 2, 3, ...", field="curves")
        for pt in points:
            rates = pt.synthetic_acceptance_rates
            if len(rates) != pt.k or any(not 0.0 <= r <= 1.0 for r in rates):
                raise InvalidInput(
                    f"curves.{cat} k={pt.k}: k rates in [0, 1] are required", field="curves"
                )
            if any(b > a + TOLERANCE for a, b in zip(rates, rates[1:], strict=False)):
                raise InvalidInput(
                    f"curves.{cat} k={pt.k}: rates must not increase (position i+1 is "
                    "accepted only after position i)",
                    field="curves",
                )
            if abs(pt.acceptance_length - (1.0 + sum(rates))) > 1e-4:
                raise InvalidInput(
                    f"curves.{cat} k={pt.k}: acceptance length {pt.acceptance_length} is not "
                    f"1 + the sum of its rates ({1.0 + sum(rates):.6f})",
                    field="curves",
                )


def _check_provenance(session: Session, prov: CurveProvenance) -> Pair:
    pair = session.scalar(select(Pair).where(Pair.pair_digest == prov.pair_digest))
    if pair is None:
        raise NotFound(
            f"no registered pair with digest {prov.pair_digest[:12]}: the curve cannot be "
            "tied to what it measured",
            field="provenance.pair_digest",
        )
    if settings_digest(prov.sampling) != prov.settings_digest:
        raise InvalidInput(
            "provenance.settings_digest is not the digest of provenance.sampling",
            field="provenance.settings_digest",
        )
    if prov.measured_k > int(pair.k):
        raise Conflict(
            f"measured k {prov.measured_k} exceeds the pair's k {pair.k}: not this pair",
            field="provenance.measured_k",
        )
    for key, have in (("method", pair.method), ("k", int(pair.k))):
        got = prov.sampling.get(key)
        if got is not None and got != have:
            raise Conflict(
                f"provenance.sampling.{key} is {got!r}; the pair's is {have!r}",
                field="provenance.sampling",
            )
    rule = (pair.config or {}).get("acceptance", "strict")
    got_rule = prov.sampling.get("acceptance", "strict")
    if got_rule != rule:
        raise Conflict(
            f"the curve was measured under the {got_rule} rule; the pair uses {rule}",
            field="provenance.sampling",
        )
    return pair


def import_acceptance_curve(
    session: Session, *, curve: AcceptanceCurve, actor: str
) -> CurveImportResult:
    """Keep a curve measured elsewhere for a registered pair (idempotent by content)."""
    if curve.format != FORMAT:
        raise InvalidInput(f"format must be {FORMAT}", field="curve.format")
    _check_numbers(curve)
    lock_writes(session)
    pair = _check_provenance(session, curve.provenance)
    body = curve.model_dump(mode="json")
    digest = sha256_hex(canonical_json(body))
    existing = session.scalar(select(AcceptanceCurveRow).where(AcceptanceCurveRow.digest == digest))
    if existing is not None:
        return CurveImportResult(
            id=existing.id, pair_digest=pair.pair_digest, digest=digest, created=False
        )
    row = AcceptanceCurveRow(
        pair_id=pair.id,
        digest=digest,
        provenance=body["provenance"],
        curves=body["curves"],
        imported_by=actor,
    )
    session.add(row)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="curve.imported",
        entity_type="pair",
        entity_id=pair.id,
        payload={
            "curve_digest": digest,
            "pair_digest": pair.pair_digest,
            "suite_digest": curve.provenance.suite_digest,
            "engine": curve.provenance.engine,
            "engine_version": curve.provenance.engine_version,
        },
    )
    return CurveImportResult(id=row.id, pair_digest=pair.pair_digest, digest=digest, created=True)
