"""``GET /metrics``: HTTP metrics and the registry's domain metrics, Prometheus text format.

HTTP metrics come from prometheus-fastapi-instrumentator (request counts, sizes and
latency histograms labelled by route *template*, method and status class, so labels stay
bounded whatever paths clients send). Domain metrics come from :class:`DomainCollector`,
which reads the database at scrape time (registry/services/observability.py, bounded
queries) instead of keeping counters in process memory: every API replica reports the same
truth, and a restart loses nothing.

Each app gets its own ``CollectorRegistry`` (tests build many apps in one process).

Who may scrape: by default a bearer token with a role that reads the registry (give
Prometheus a ``reader`` token: ``authorization: {credentials: prt_…}`` in the scrape
config). ``PAIRREG_METRICS_PUBLIC=true`` serves it without a token, for a scrape network
that is already private.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_fastapi_instrumentator import Instrumentator

from api.auth import _bearer, require
from registry.db import session_scope
from registry.governance import roles
from registry.services.drift import FLAG_KINDS
from registry.services.jobs import JOB_STATES
from registry.services.observability import Snapshot, snapshot

PREFIX = "pairreg"
ONLINE_STATES = ("watching", "alarmed", "no_baseline")

router = APIRouter(include_in_schema=False)


class DomainCollector(Collector):
    """Domain gauges and counters computed from the database at each scrape."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            f"{PREFIX}_database_up", "1 when the last scrape could read the registry database."
        )
        try:
            with session_scope(self.db_url) as session:
                snap = snapshot(session)
        except Exception:  # noqa: BLE001 - a scrape must answer even when the DB is down
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families(snap, datetime.now(UTC))


def families(snap: Snapshot, now: datetime) -> Iterator[Metric]:
    """The metric families for one snapshot (pure: the test lints these)."""
    live = InfoMetricFamily(
        f"{PREFIX}_deployment_live_pair",
        "The pair live on each deployment.",
        labels=["deployment"],
    )
    alpha = GaugeMetricFamily(
        f"{PREFIX}_deployment_alpha_ratio",
        "Acceptance α of the live pair's latest measurement, overall.",
        labels=["deployment"],
    )
    by_cat = GaugeMetricFamily(
        f"{PREFIX}_deployment_category_alpha_ratio",
        "Acceptance α of the live pair's latest measurement, per task category.",
        labels=["deployment", "category"],
    )
    validated = GaugeMetricFamily(
        f"{PREFIX}_deployment_validated_acceptance_ratio",
        "Draft acceptance rate (accepted/drafted) the live pair was validated at.",
        labels=["deployment"],
    )
    online = GaugeMetricFamily(
        f"{PREFIX}_deployment_online_acceptance_ratio",
        "Draft acceptance rate (accepted/drafted) of served requests, live pair, since live.",
        labels=["deployment"],
    )
    evidence = GaugeMetricFamily(
        f"{PREFIX}_deployment_online_drop_evidence_log",
        "Natural log of the online drop test's e-value; alarm at log(1/level).",
        labels=["deployment"],
    )
    state = GaugeMetricFamily(
        f"{PREFIX}_deployment_online_state",
        "1 for the online monitor's current state (watching, alarmed, no_baseline).",
        labels=["deployment", "state"],
    )
    tested = CounterMetricFamily(
        f"{PREFIX}_deployment_online_tested_requests",
        "Served requests of the live pair fed to the online test.",
        labels=["deployment"],
    )
    for d in snap.deployments:
        if d.pair_digest:
            live.add_metric([d.name], {"pair_digest": d.pair_digest, "method": d.method or ""})
        if d.alpha is not None:
            alpha.add_metric([d.name], d.alpha)
        for cat, value in d.alpha_by_category.items():
            by_cat.add_metric([d.name, cat], value)
        if d.validated_alpha is not None:
            validated.add_metric([d.name], d.validated_alpha)
        if d.online_alpha is not None:
            online.add_metric([d.name], d.online_alpha)
        if d.online_e_value_log is not None:
            evidence.add_metric([d.name], d.online_e_value_log)
        if d.online_state is not None:
            for s in ONLINE_STATES:
                state.add_metric([d.name, s], 1.0 if s == d.online_state else 0.0)
            tested.add_metric([d.name], float(d.online_tested))
    yield from (live, alpha, by_cat, validated, online, evidence, state, tested)

    flags = GaugeMetricFamily(f"{PREFIX}_drift_flags_open", "Open flags by kind.", labels=["kind"])
    for kind in FLAG_KINDS:
        flags.add_metric([kind], float(snap.flags_open.get(kind, 0)))
    yield flags
    jobs = GaugeMetricFamily(f"{PREFIX}_jobs", "Jobs by state.", labels=["state"])
    for s in JOB_STATES:
        jobs.add_metric([s], float(snap.jobs.get(s, 0)))
    yield jobs
    yield CounterMetricFamily(
        f"{PREFIX}_request_tags_ingested",
        "Request tags stored (duplicates not counted).",
        value=float(snap.tags_ingested),
    )
    yield CounterMetricFamily(
        f"{PREFIX}_audit_events",
        "Events in the audit log (the Merkle tree's size).",
        value=float(snap.audit_events),
    )
    if snap.last_checkpoint_at is not None:
        at = snap.last_checkpoint_at
        yield GaugeMetricFamily(
            f"{PREFIX}_audit_last_checkpoint_timestamp_seconds",
            "Unix time of the newest signed checkpoint of the audit log.",
            value=at.timestamp(),
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_audit_last_checkpoint_age_seconds",
            "Seconds since the newest signed checkpoint of the audit log.",
            value=max((now - at).total_seconds(), 0.0),
        )


def install_metrics(app: FastAPI) -> None:
    """HTTP instrumentation and the domain collector on a registry owned by ``app``."""
    registry = CollectorRegistry()
    Instrumentator(
        should_group_status_codes=True,
        should_ignore_untemplated=True,
        excluded_handlers=["/metrics", "/healthz", "/readyz"],
        registry=registry,
    ).instrument(app, metric_namespace=PREFIX)
    registry.register(DomainCollector(app.state.db_url))
    app.state.metrics_registry = registry


_readers = require(roles.METRICS)


@router.get("/metrics")
def metrics(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)
) -> Response:
    if not request.app.state.settings.metrics_public:
        _readers(request, credentials)
    body = generate_latest(request.app.state.metrics_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
