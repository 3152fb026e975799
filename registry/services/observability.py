"""The registry's state as a few bounded numbers, for the ``/metrics`` collector.

Every query here is bounded: by the number of deployments (at most ``MAX_DEPLOYMENTS``),
by fixed label sets (flag kinds, job states), or by an index (the audit log's newest event, the
newest checkpoint). Nothing scans request tags: ingested tags are summed over
``request_batches`` (one row per accepted ingest call). Labels are deployment names,
categories, flag kinds and job states, never a request id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.tables import (
    AuditEvent,
    Deployment,
    DriftFlag,
    Job,
    LogCheckpoint,
    Measurement,
    OnlineMonitor,
    Pair,
    RequestBatch,
)

MAX_DEPLOYMENTS = 200
MAX_CATEGORIES = 50


@dataclass
class DeploymentSnapshot:
    name: str
    pair_digest: str | None
    method: str | None
    alpha: float | None = None  # latest measurement of the live pair, overall
    alpha_by_category: dict[str, float] = field(default_factory=dict)
    validated_alpha: float | None = None
    online_alpha: float | None = None
    online_e_value_log: float | None = None
    online_state: str | None = None
    online_tested: int = 0


@dataclass
class Snapshot:
    deployments: list[DeploymentSnapshot]
    flags_open: dict[str, int]
    jobs: dict[str, int]
    tags_ingested: int
    audit_events: int
    last_checkpoint_at: datetime | None


def snapshot(session: Session) -> Snapshot:
    deps = session.execute(
        select(Deployment.id, Deployment.name, Deployment.current_pair_id)
        .order_by(Deployment.name)
        .limit(MAX_DEPLOYMENTS)
    ).all()
    pair_ids = sorted({p for _, _, p in deps if p is not None})
    pairs = {
        pid: (digest, method)
        for pid, digest, method in session.execute(
            select(Pair.id, Pair.pair_digest, Pair.method).where(Pair.id.in_(pair_ids or [0]))
        )
    }
    newest = (
        select(func.max(Measurement.id))
        .where(Measurement.pair_id.in_(pair_ids or [0]))
        .group_by(Measurement.pair_id)
    )
    measured = {
        pid: (alpha, cats or {})
        for pid, alpha, cats in session.execute(
            select(Measurement.pair_id, Measurement.alpha, Measurement.categories).where(
                Measurement.id.in_(newest)
            )
        )
    }
    monitors = {
        (m.deployment_id, m.pair_id): m
        for m in session.scalars(
            select(OnlineMonitor).where(OnlineMonitor.pair_id.in_(pair_ids or [0]))
        )
    }
    out: list[DeploymentSnapshot] = []
    for dep_id, name, pair_id in deps:
        digest, method = pairs.get(pair_id, (None, None)) if pair_id else (None, None)
        snap = DeploymentSnapshot(name=name, pair_digest=digest, method=method)
        if pair_id in measured:
            alpha, cats = measured[pair_id]
            snap.alpha = alpha
            for cat in sorted(cats)[:MAX_CATEGORIES]:
                value = (cats[cat] or {}).get("alpha")
                if isinstance(value, int | float):
                    snap.alpha_by_category[cat] = float(value)
        mon = monitors.get((dep_id, pair_id))
        if mon is not None:
            snap.validated_alpha = mon.validated_alpha
            snap.online_alpha = mon.accepted / mon.drafted if mon.drafted else None
            snap.online_e_value_log = float((mon.drop_test or {}).get("log_wealth", 0.0))
            snap.online_state = mon.state
            snap.online_tested = int(mon.tested)
        out.append(snap)
    flags = dict(
        session.execute(
            select(DriftFlag.kind, func.count())
            .where(DriftFlag.state == "open")
            .group_by(DriftFlag.kind)
        ).all()
    )
    jobs = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    tags = session.scalar(select(func.coalesce(func.sum(RequestBatch.stored), 0)))
    events = session.scalar(select(func.max(AuditEvent.seq)))
    checkpoint = session.scalar(select(func.max(LogCheckpoint.signed_at)))
    return Snapshot(
        deployments=out,
        flags_open={str(k): int(v) for k, v in flags.items()},
        jobs={str(k): int(v) for k, v in jobs.items()},
        tags_ingested=int(tags or 0),
        audit_events=int(events or 0),
        last_checkpoint_at=checkpoint,
    )
