"""Online acceptance per deployment, compared continuously with the validated rate.

The rule, in one place: every request tag that carries spec-decode counters is one
observation ``x = accepted / drafted`` for the (deployment, pair) that served it. Each such
pair has a monitor (models/online.py) running the anytime-valid betting test of
registry/stats/online.py for ``H0: mean per-request rate >= validated - tolerance``:

* ``watching`` → ``alarmed`` when the drop test's e-value reaches ``1 / level``: a
  ``workload`` flag opens on the pair with the evidence (or an open one is linked), and a
  recovery test starts from scratch (``H0: mean <= validated - tolerance``);
* ``alarmed`` → ``watching`` when the recovery e-value reaches ``1 / level``: the flag is
  resolved with an audit event carrying the evidence, and the drop test starts afresh.
  A flag a person resolved by hand also returns the monitor to ``watching``.

The validated rate is the draft acceptance rate (accepted / drafted) of the measurement that
validated the pair for the deployment (``telemetry.baseline_acceptance``): the same ratio
vLLM's per-request counters give. Level, tolerance and the minimum draft tokens per tested
request come from the deployment policy's ``[online]`` section.

It runs on ingest (``requests.ingest_requests`` calls :func:`observe`) inside the ingest
transaction, after the audit event took the registry's write lock, so concurrent batches
update a monitor one at a time and in one order; what needs no monitor (grouping, ordering,
bucketing the batch's rows: :func:`prepare`) is done before the lock. Within a batch,
tags are fed in ``(served_at, request_id)`` order; batches in arrival order. The e-process
only needs each bet fixed before its observation is seen, which holds in any order chosen
without looking at the values.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Annotated, Any, NamedTuple

from pydantic import Field
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from registry.errors import InvalidInput
from registry.governance.policy import DEFAULTS
from registry.params import DeploymentName, Timestamp
from registry.records.online import (
    OnlineAlpha,
    OnlineBucketRecord,
    OnlineMonitorRecord,
    ScrapeRecord,
)
from registry.refs import resolve_deployment
from registry.services import drift
from registry.services.policies import policy_in_force
from registry.services.telemetry import baseline_acceptance
from registry.stats import online as online_stats
from registry.tables import (
    Deployment,
    DriftFlag,
    OnlineBucket,
    OnlineMonitor,
    Pair,
    TelemetrySample,
    utcnow,
)

BUCKET_SECONDS = 300
MAX_BUCKET_ROWS = 20_000
MAX_SCRAPES = 2_000
METHOD = (
    "betting e-process with online-Newton-step bets on per-request acceptance rates "
    "(Waudby-Smith & Ramdas, JRSS-B 2024); alarm when the e-value reaches 1/level"
)


def _bucket_start(at: datetime, seconds: int = BUCKET_SECONDS) -> datetime:
    at = at.astimezone(UTC)
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, UTC)


def online_settings(session: Session, policy_name: str) -> dict[str, float]:
    """The deployment policy's ``[online]`` section (defaults for policies stored before it)."""
    out = dict(DEFAULTS["online"])
    pol = policy_in_force(session, policy_name)
    if pol is not None:
        out.update(((pol.parsed or {}).get("online")) or {})
    return out


def _new_monitor(session: Session, dep: Deployment, pair_id: int) -> OnlineMonitor:
    cfg = online_settings(session, dep.policy_name)
    validated = baseline_acceptance(session, dep.id, pair_id)
    reference = None if validated is None else max(validated - float(cfg["tolerance"]), 0.0)
    now = utcnow()
    mon = OnlineMonitor(
        deployment_id=dep.id,
        pair_id=pair_id,
        validated_alpha=validated,
        reference=reference,
        level=float(cfg["level"]),
        tolerance=float(cfg["tolerance"]),
        min_drafted=int(cfg["min_drafted"]),
        state="no_baseline" if reference is None else "watching",
        drop_test=online_stats.BettingState().as_dict(),
        recovery_test=None,
        requests=0,
        tested=0,
        drafted=0,
        accepted=0,
        rate_sum=0.0,
        alarms=0,
        started_at=now,
        updated_at=now,
    )
    session.add(mon)
    session.flush()
    return mon


class Observation(NamedTuple):
    """What monitoring reads from one stored tag; ``drafted``/``accepted`` are its spec
    counters (None when the tag carried none)."""

    request_id: str
    served_at: datetime
    deployment_id: int
    pair_id: int
    drafted: int | None
    accepted: int | None


@dataclass
class Group:
    """One (deployment, pair)'s observations from a batch, in ``(served_at, request_id)``
    order, with each one's bucket start (epoch seconds) and those buckets' instants."""

    deployment_id: int
    pair_id: int
    rows: list[Observation]
    starts: list[int]
    stamps: dict[int, datetime]


def prepare(rows: Sequence[Observation]) -> list[Group]:
    """The part of :func:`observe` that reads no monitor: run it before taking the
    monitors' locks, so they are held for less."""
    by_key: dict[tuple[int, int], list[Observation]] = defaultdict(list)
    for r in rows:
        by_key[(r.deployment_id, r.pair_id)].append(r)
    out = []
    for (dep_id, pair_id), group in sorted(by_key.items()):
        # (served_at, request_id) order: two stable sorts, cheap on ingest's id-sorted rows.
        group.sort(key=_request_id)
        group.sort(key=_served_at)
        # Bucket of each row (its epoch second rounded down, as _bucket_start does): rows
        # are in served_at order, so each bucket is one run of rows.
        epochs = [int(r.served_at.timestamp()) for r in group]
        starts = [e - e % BUCKET_SECONDS for e in epochs]
        stamps = {e: datetime.fromtimestamp(e, UTC) for e in dict.fromkeys(starts)}
        out.append(Group(dep_id, pair_id, group, starts, stamps))
    return out


def observe(
    session: Session, groups: Sequence[Group], *, actor: str, home_dir: str | None = None
) -> None:
    """Feed freshly stored tags (their :func:`prepare` groups) to their monitors
    (``home_dir``: the serving process's home, where a recovered pair's gates find their
    hardware profiles)."""
    for group in groups:
        _observe_group(session, group, actor, home_dir)


_request_id = attrgetter("request_id")
_served_at = attrgetter("served_at")
_KEYS = ("requests", "tested", "drafted", "accepted", "rate_sum")


def _lock_monitor(session: Session, deployment_id: int, pair_id: int) -> None:
    """Batches feeding one monitor take turns until they commit (its test is sequential and
    its counters are read then written; creating it must happen once); batches for other
    monitors do not wait. :func:`prepare` sorts the groups, so two batches take these
    locks in the same order and cannot deadlock. SQLite's BEGIN IMMEDIATE already
    serialises every writer. (The audit log's lock used to order them; it is gone.)"""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(:ns, hashtext(:key))"),
            {"ns": _PG_MONITOR_LOCKS, "key": f"{deployment_id}:{pair_id}"},
        )


# An arbitrary constant naming the online monitors' locks among two-key advisory locks.
_PG_MONITOR_LOCKS = 72_019_583


def _observe_group(session: Session, group: Group, actor: str, home_dir: str | None) -> None:
    dep_id, pair_id, rows, starts, stamps = (
        group.deployment_id,
        group.pair_id,
        group.rows,
        group.starts,
        group.stamps,
    )
    _lock_monitor(session, dep_id, pair_id)
    dep = session.get(Deployment, dep_id)
    assert dep is not None
    mon = session.scalar(
        select(OnlineMonitor).where(
            OnlineMonitor.deployment_id == dep_id, OnlineMonitor.pair_id == pair_id
        )
    )
    if mon is None:
        mon = _new_monitor(session, dep, pair_id)
    _follow_manual_close(session, mon)
    buckets = {
        b.start.astimezone(UTC): b
        for b in session.scalars(
            select(OnlineBucket).where(
                OnlineBucket.monitor_id == mon.id, OnlineBucket.start.in_(list(stamps.values()))
            )
        )
    }
    # Counters accumulate in plain locals and reach the ORM objects once per batch (and
    # before an alarm or a recovery reads them): attribute events cost more than the test.
    # The additions are the same, in the same order, as one row at a time through dicts.
    t_req, t_tested, t_drafted, t_accepted, t_rate = (getattr(mon, k) for k in _KEYS)
    drop = online_stats.BettingState.from_dict(mon.drop_test)
    recovery = online_stats.BettingState.from_dict(mon.recovery_test)
    line = online_stats.threshold(mon.level)
    reference, min_drafted, state = mon.reference, mon.min_drafted, mon.state
    step = online_stats.step
    sums: dict[int, list[Any]] = {}

    def sync() -> None:
        mon.requests, mon.tested, mon.drafted = t_req, t_tested, t_drafted
        mon.accepted, mon.rate_sum = t_accepted, t_rate

    i, n = 0, len(rows)
    while i < n:
        start = starts[i]
        b = buckets.get(stamps[start])
        b_req, b_tested, b_drafted, b_accepted, b_rate = (
            (getattr(b, k) for k in _KEYS) if b is not None else (0, 0, 0, 0, 0)
        )
        while i < n and starts[i] == start:
            r = rows[i]
            i += 1
            b_req += 1
            t_req += 1
            drafted = r.drafted
            if drafted is None or drafted < min_drafted:
                continue
            accepted = min(r.accepted or 0, drafted)
            x = accepted / drafted
            b_tested += 1
            b_drafted += drafted
            b_accepted += accepted
            b_rate += x
            t_tested += 1
            t_drafted += drafted
            t_accepted += accepted
            t_rate += x
            if reference is None:
                continue
            if state == "watching":
                if step(drop, x, reference) >= line:
                    sync()
                    mon.drop_test = drop.as_dict()
                    _alarm(session, mon, dep, _pair(session, pair_id), r.served_at, actor)
                    recovery, state = online_stats.BettingState(), mon.state
            elif state == "alarmed":
                if step(recovery, 1.0 - x, 1.0 - reference) >= line:
                    sync()
                    mon.recovery_test = recovery.as_dict()
                    _recover(session, mon, _pair(session, pair_id), r.served_at, actor, home_dir)
                    drop, state = online_stats.BettingState(), mon.state
        sums[start] = [b_req, b_tested, b_drafted, b_accepted, b_rate, drop.log_wealth, state]
    for start, values in sums.items():
        stamp = stamps[start]
        b = buckets.get(stamp)
        if b is None:
            b = buckets[stamp] = OnlineBucket(monitor_id=mon.id, start=stamp)
            session.add(b)
        (b.requests, b.tested, b.drafted, b.accepted, b.rate_sum, b.log_e, b.state) = values
    sync()
    mon.drop_test = drop.as_dict()
    mon.recovery_test = recovery.as_dict() if state == "alarmed" else None
    mon.updated_at = utcnow()
    session.flush()


def _pair(session: Session, pair_id: int) -> Pair:
    """The pair, loaded only when an alarm or a recovery needs it (it joins both artifacts)."""
    pair = session.get(Pair, pair_id)
    assert pair is not None
    return pair


def _follow_manual_close(session: Session, mon: OnlineMonitor) -> None:
    """A person resolved the flag: the monitor watches again from scratch."""
    if mon.state != "alarmed" or mon.flag_id is None:
        return
    flag = session.get(DriftFlag, mon.flag_id)
    if flag is not None and flag.state == "resolved":
        mon.state = "watching"
        mon.drop_test = online_stats.BettingState().as_dict()
        mon.recovery_test = None


def _evidence(mon: OnlineMonitor, test: online_stats.BettingState) -> dict[str, Any]:
    return {
        "method": METHOD,
        "level": mon.level,
        "tolerance": mon.tolerance,
        "validated_alpha": mon.validated_alpha,
        "reference": mon.reference,
        "e_value": math.exp(min(test.log_wealth, 700.0)),
        "requests_in_test": test.n,
        "mean_request_alpha_in_test": test.x_sum / test.n if test.n else None,
        "alpha_since_start": mon.accepted / mon.drafted if mon.drafted else None,
        "tested_since_start": mon.tested,
    }


def _alarm(
    session: Session,
    mon: OnlineMonitor,
    dep: Deployment,
    pair: Pair,
    at: datetime,
    actor: str,
) -> None:
    drop = online_stats.BettingState.from_dict(mon.drop_test)
    mon.state = "alarmed"
    mon.alarms += 1
    mon.alarm_at = at
    evidence = _evidence(mon, drop)
    flag = session.scalar(
        select(DriftFlag).where(
            DriftFlag.kind == "workload",
            DriftFlag.pair_id == pair.id,
            DriftFlag.state.in_(("open", "acknowledged")),
        )
    )
    if flag is None:
        mean = evidence["mean_request_alpha_in_test"]
        summary = (
            f"workload drift on {dep.name}: served requests accept {mean:.4f} of draft tokens "
            f"on average over {drop.n} requests, below the validated {mon.validated_alpha:.4f} "
            f"minus tolerance {mon.tolerance:.4f} (e-value {evidence['e_value']:.3g} >= "
            f"1/{mon.level:g}; anytime-valid)"
        )
        flag = drift.open_flag(
            session,
            DriftFlag(
                kind="workload",
                pair_id=pair.id,
                policy_name=dep.policy_name,
                effects={"deployment": dep.name, "source": "online", **evidence},
                severity="high"
                if mean is not None and mon.reference - mean > 2 * max(mon.tolerance, 0.02)
                else "medium",
                summary=summary,
            ),
            actor=actor,
            payload={
                "pair_digest": pair.pair_digest,
                "deployment": dep.name,
                "summary": summary,
                "evidence": evidence,
            },
        )
    mon.flag_id = flag.id


def _recover(
    session: Session,
    mon: OnlineMonitor,
    pair: Pair,
    at: datetime,
    actor: str,
    home_dir: str | None,
) -> None:
    recovery = online_stats.BettingState.from_dict(mon.recovery_test)
    evidence = _evidence(mon, recovery)
    flag = session.get(DriftFlag, mon.flag_id) if mon.flag_id else None
    if flag is not None and flag.state in ("open", "acknowledged"):
        mean = evidence["mean_request_alpha_in_test"]
        drift.resolve_flag(
            session,
            id=flag.id,
            reason=(
                f"recovered: served requests accept {mean:.4f} on average over {recovery.n} "
                f"requests since the alarm, above {mon.reference:.4f} (recovery e-value "
                f"{evidence['e_value']:.3g} >= 1/{mon.level:g}) at {at.isoformat()}"
            ),
            actor=actor,
            home_dir=home_dir,
        )
    mon.state = "watching"
    mon.recovery_test = None


# --- reading ----------------------------------------------------------------------------


def _e(log_w: float) -> float:
    return math.exp(min(log_w, 700.0))


def monitor_record(mon: OnlineMonitor, pair_digest: str, live: bool) -> OnlineMonitorRecord:
    drop = online_stats.BettingState.from_dict(mon.drop_test)
    rec = online_stats.BettingState.from_dict(mon.recovery_test) if mon.recovery_test else None
    return OnlineMonitorRecord(
        pair_digest=pair_digest,
        live=live,
        state=mon.state,
        validated_alpha=mon.validated_alpha,
        reference=mon.reference,
        level=mon.level,
        tolerance=mon.tolerance,
        e_value=_e(drop.log_wealth),
        recovery_e_value=_e(rec.log_wealth) if rec is not None else None,
        requests=mon.requests,
        tested=mon.tested,
        drafted=mon.drafted,
        accepted=mon.accepted,
        alpha=mon.accepted / mon.drafted if mon.drafted else None,
        mean_request_alpha=mon.rate_sum / mon.tested if mon.tested else None,
        alarms=mon.alarms,
        flag_id=mon.flag_id,
        started_at=mon.started_at,
        updated_at=mon.updated_at,
        alarm_at=mon.alarm_at,
    )


def deployment_online_alpha(
    session: Session,
    *,
    name: DeploymentName,
    since: Timestamp | None = None,
    until: Timestamp | None = None,
    bucket_seconds: Annotated[
        int,
        Field(
            ge=BUCKET_SECONDS,
            le=86_400,
            multiple_of=BUCKET_SECONDS,
            description="Bucket width: a multiple of 300 seconds, at most a day.",
        ),
    ] = BUCKET_SECONDS,
) -> OnlineAlpha:
    """Online α of a deployment in time buckets, and each pair's sequential test state.

    At most the newest 20,000 stored five-minute buckets in the window are read; narrow
    the window with ``since``/``until`` to see older ones.
    """
    if bucket_seconds % BUCKET_SECONDS or not BUCKET_SECONDS <= bucket_seconds <= 86_400:
        raise InvalidInput(
            "bucket_seconds must be a multiple of 300 from 300 to 86400", field="bucket_seconds"
        )
    for value, label in ((since, "since"), (until, "until")):
        if value is not None and value.tzinfo is None:
            raise InvalidInput(f"{label} must include a timezone (e.g. Z)", field=label)
    dep = resolve_deployment(session, name)
    monitors = list(
        session.scalars(
            select(OnlineMonitor)
            .where(OnlineMonitor.deployment_id == dep.id)
            .order_by(OnlineMonitor.updated_at.desc(), OnlineMonitor.id.desc())
        )
    )
    digests = {
        i: d
        for i, d in session.execute(
            select(Pair.id, Pair.pair_digest).where(
                Pair.id.in_([m.pair_id for m in monitors] + [dep.current_pair_id or 0])
            )
        )
    }
    live_id = dep.current_pair_id
    monitors.sort(key=lambda m: m.pair_id != live_id)  # stable: the live pair's first
    by_id = {m.id: m for m in monitors}
    stmt = select(OnlineBucket).where(OnlineBucket.monitor_id.in_(list(by_id) or [0]))
    if since is not None:
        stmt = stmt.where(OnlineBucket.start >= _bucket_start(since))
    if until is not None:
        stmt = stmt.where(OnlineBucket.start < until)
    rows = list(session.scalars(stmt.order_by(OnlineBucket.start.desc()).limit(MAX_BUCKET_ROWS)))
    rows.reverse()
    merged: dict[tuple[datetime, int], dict[str, Any]] = {}
    for b in rows:
        start = _bucket_start(b.start, bucket_seconds)
        acc = merged.setdefault(
            (start, b.monitor_id),
            {"requests": 0, "tested": 0, "drafted": 0, "accepted": 0, "rate_sum": 0.0},
        )
        for key in ("requests", "tested", "drafted", "accepted", "rate_sum"):
            acc[key] += getattr(b, key)
        acc["log_e"], acc["state"] = b.log_e, b.state  # the last bucket's end
    buckets = []
    for (start, mon_id), acc in sorted(merged.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        mon = by_id[mon_id]
        buckets.append(
            OnlineBucketRecord(
                start=start,
                end=start + timedelta(seconds=bucket_seconds),
                pair_digest=digests[mon.pair_id],
                requests=acc["requests"],
                tested=acc["tested"],
                drafted=acc["drafted"],
                accepted=acc["accepted"],
                alpha=acc["accepted"] / acc["drafted"] if acc["drafted"] else None,
                mean_request_alpha=acc["rate_sum"] / acc["tested"] if acc["tested"] else None,
                validated_alpha=mon.validated_alpha,
                e_value=_e(acc["log_e"]),
                state=acc["state"],
            )
        )
    samples = select(TelemetrySample).where(TelemetrySample.deployment_id == dep.id)
    if since is not None:
        samples = samples.where(TelemetrySample.scraped_at >= since)
    if until is not None:
        samples = samples.where(TelemetrySample.scraped_at < until)
    scraped = list(session.scalars(samples.order_by(TelemetrySample.id.desc()).limit(MAX_SCRAPES)))
    scraped.reverse()
    missing = {t.pair_id for t in scraped if t.pair_id and t.pair_id not in digests}
    if missing:
        digests.update(
            session.execute(select(Pair.id, Pair.pair_digest).where(Pair.id.in_(missing))).all()
        )
    scrapes = [
        ScrapeRecord(
            at=t.scraped_at,
            pair_digest=digests.get(t.pair_id) if t.pair_id else None,
            drafted=t.drafted,
            accepted=t.accepted,
            alpha=t.accepted / t.drafted if t.drafted else None,
            reset=t.reset,
        )
        for t in scraped
    ]
    return OnlineAlpha(
        deployment=dep.name,
        live_pair_digest=digests.get(live_id) if live_id else None,
        bucket_seconds=bucket_seconds,
        method=METHOD,
        monitors=[monitor_record(m, digests[m.pair_id], m.pair_id == live_id) for m in monitors],
        buckets=buckets,
        scrapes=scrapes,
    )
