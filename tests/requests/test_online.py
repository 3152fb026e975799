"""Online acceptance on ingest: buckets, the drop alarm, the workload flag and recovery."""

from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from registry.db import session_scope
from registry.services import online
from registry.services import requests as svc
from registry.settings import Settings
from registry.tables import AuditEvent, DriftFlag, OnlineMonitor
from tests.requests.conftest import ACTOR, Served
from tests.requests.test_telemetry_export import _baseline


def _tags(s: Served, rng: np.random.Generator, mean: float, n: int, start: int):  # type: ignore[no-untyped-def]
    out = []
    for i in range(start, start + n):
        drafted = int(rng.integers(16, 129))
        p = rng.beta(mean * 20, (1 - mean) * 20)
        out.append({
            "request_id": f"o-{i}",
            "deployment": s.deployment,
            "served_at": (s.t_b + timedelta(seconds=i + 1)).isoformat(),
            "input_tokens": 10,
            "output_tokens": 20,
            "spec": {"num_spec_steps": drafted // 4, "num_draft_tokens": drafted,
                     "num_accepted_draft_tokens": int(rng.binomial(drafted, p))},
        })  # fmt: skip
    return out


def _ingest(url: str, tags) -> None:  # type: ignore[no-untyped-def]
    for i in range(0, len(tags), 100):
        with session_scope(url) as session:
            svc.ingest_requests(session, tags=tags[i : i + 100], actor=ACTOR)


def _view(url: str, name: str, **kw):  # type: ignore[no-untyped-def]
    with session_scope(url) as session:
        return online.deployment_online_alpha(session, name=name, **kw)


def test_drop_opens_a_workload_flag_and_recovery_resolves_it(served: Served) -> None:
    s = served
    _baseline(s.url, s.pair_b, 0.60)
    rng = np.random.default_rng(5)
    healthy = _tags(s, rng, 0.60, 300, 0)
    _ingest(s.url, healthy)
    view = _view(s.url, s.deployment)
    mon = view.monitors[0]
    assert mon.live and mon.pair_digest == s.pair_b and mon.state == "watching"
    assert mon.validated_alpha == pytest.approx(0.60) and mon.reference == pytest.approx(0.58)
    assert mon.tested == 300 and mon.flag_id is None
    drafted = sum(t["spec"]["num_draft_tokens"] for t in healthy)
    accepted = sum(t["spec"]["num_accepted_draft_tokens"] for t in healthy)
    assert (mon.drafted, mon.accepted) == (drafted, accepted)
    assert sum(b.drafted for b in view.buckets) == drafted
    assert all(b.pair_digest == s.pair_b for b in view.buckets)

    dropped = _tags(s, rng, 0.45, 1000, 300)
    _ingest(s.url, dropped)
    mon = _view(s.url, s.deployment).monitors[0]
    assert mon.state == "alarmed" and mon.alarms == 1 and mon.flag_id is not None
    with session_scope(s.url) as session:
        flag = session.get(DriftFlag, mon.flag_id)
        assert flag.kind == "workload" and flag.state == "open"
        assert flag.effects["source"] == "online" and flag.effects["e_value"] >= 100
        assert flag.effects["mean_request_alpha_in_test"] < 0.58
        opened = session.scalar(
            select(AuditEvent).where(AuditEvent.action == "workload.flag_opened")
        )
        assert opened is not None and json.loads(opened.payload)["evidence"][
            "level"
        ] == pytest.approx(0.01)

    recovered = _tags(s, rng, 0.65, 1500, 1300)
    _ingest(s.url, recovered)
    view = _view(s.url, s.deployment, bucket_seconds=600)
    mon = view.monitors[0]
    assert mon.state == "watching" and mon.recovery_e_value is None
    with session_scope(s.url) as session:
        flag = session.get(DriftFlag, mon.flag_id)
        assert flag.state == "resolved" and flag.reason.startswith("recovered")
        resolved = session.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "drift.flag_resolved", AuditEvent.entity_id == str(flag.id)
            )
        )
        assert resolved is not None
    assert all((b.end - b.start).total_seconds() == 600 for b in view.buckets)
    assert sum(b.tested for b in view.buckets) == 2800
    # Five-minute buckets: the first holds at most 300 of the healthy requests (one a second).
    states = [b.state for b in _view(s.url, s.deployment).buckets]
    assert states[0] == "watching" and "alarmed" in states and states[-1] == "watching"


def test_requests_without_counters_count_but_are_not_tested(served: Served) -> None:
    s = served
    at = (s.t_b + timedelta(minutes=1)).isoformat()
    tags = [{"request_id": f"n-{i}", "deployment": s.deployment, "served_at": at} for i in range(5)]
    with session_scope(s.url) as session:
        svc.ingest_requests(session, tags=tags, actor=ACTOR)
    mon = _view(s.url, s.deployment).monitors[0]
    assert mon.requests == 5 and mon.tested == 0 and mon.alpha is None
    assert mon.state == "no_baseline"  # no measurement on the pair: counted, never tested


def test_a_flag_resolved_by_hand_returns_the_monitor_to_watching(served: Served) -> None:
    s = served
    _baseline(s.url, s.pair_b, 0.60)
    rng = np.random.default_rng(8)
    _ingest(s.url, _tags(s, rng, 0.40, 600, 0))
    mon = _view(s.url, s.deployment).monitors[0]
    assert mon.state == "alarmed"
    from registry.services import drift

    with session_scope(s.url) as session:
        drift.resolve_flag(session, id=mon.flag_id, reason="drafter retrained", actor=ACTOR)
    _ingest(s.url, _tags(s, rng, 0.60, 10, 600))
    with session_scope(s.url) as session:
        row = session.scalar(select(OnlineMonitor))
        assert row.state == "watching" and row.drop_test["n"] == 10


def test_online_alpha_over_http(home: Settings, served: Served) -> None:
    token = json.loads(home.credentials_path.read_text())["token"]
    client = TestClient(create_app(home))
    auth = {"Authorization": f"Bearer {token}"}
    url = f"/v1/deployments/{served.deployment}/online-alpha"
    r = client.get(url, params={"bucket_seconds": 3600}, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["deployment"] == served.deployment and r.json()["buckets"] == []
    bad = client.get(url, params={"bucket_seconds": 301}, headers=auth)
    assert bad.status_code == 422 and bad.json()["field"] == "bucket_seconds"
    assert client.get("/v1/deployments/nope/online-alpha", headers=auth).status_code == 404


def test_online_cli(home: Settings, served: Served) -> None:
    from typer.testing import CliRunner

    from cli.main import app
    from tests.api.conftest import run_cli

    s = served
    _baseline(s.url, s.pair_b, 0.60)
    _ingest(s.url, _tags(s, np.random.default_rng(2), 0.60, 20, 0))
    runner = CliRunner()
    out = runner.invoke(app, ["deployment", "online", s.deployment, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["monitors"][0]["tested"] == 20
    text = runner.invoke(app, ["deployment", "online", s.deployment, "--bucket", "600"])
    assert text.exit_code == 0 and "buckets of 600 s" in text.output
    bad = run_cli("deployment", "online", s.deployment, "--bucket", "7")
    assert bad.exit_code == 2 and "bucket_seconds" in bad.output


def test_scraped_counters_are_shown_beside_the_test(served: Served) -> None:
    from registry.services import telemetry
    from tests.requests.test_telemetry_export import metrics

    s = served
    for counts in ((10, 40, 20), (110, 440, 260), (5, 20, 10)):  # the last one: a restart
        with session_scope(s.url) as session:
            telemetry.ingest_prometheus(
                session, deployment=s.deployment, text=metrics(*counts), actor=ACTOR
            )
    view = _view(s.url, s.deployment)
    assert [(x.drafted, x.accepted, x.reset) for x in view.scrapes] == [
        (0, 0, False), (400, 240, False), (20, 10, True)
    ]  # fmt: skip
    assert view.scrapes[1].alpha == pytest.approx(0.6) and view.scrapes[0].alpha is None
    assert {x.pair_digest for x in view.scrapes} == {s.pair_b}
    assert view.monitors == [] and view.buckets == []  # scrapes never feed the test


def test_concurrent_batches_update_one_monitor_without_losing_counts(served: Served) -> None:
    from concurrent.futures import ThreadPoolExecutor

    s = served
    _baseline(s.url, s.pair_b, 0.60)
    tags = _tags(s, np.random.default_rng(9), 0.60, 400, 0)
    batches = [tags[i : i + 50] for i in range(0, 400, 50)]

    def one(batch):  # type: ignore[no-untyped-def]
        with session_scope(s.url) as session:
            return svc.ingest_requests(session, tags=batch, actor=ACTOR).stored

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(one, batches)) == 400
    view = _view(s.url, s.deployment)
    (mon,) = view.monitors
    assert mon.tested == 400 and mon.drafted == sum(t["spec"]["num_draft_tokens"] for t in tags)
    assert sum(b.tested for b in view.buckets) == 400
