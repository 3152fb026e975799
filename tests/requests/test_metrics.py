"""GET /metrics: who may scrape, HTTP and domain metrics, and a lint of names and labels."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from api.app import create_app
from registry.db import session_scope
from registry.settings import Settings
from registry.tables import AuditEvent
from tests.requests.conftest import Served
from tests.requests.test_online import _ingest, _tags
from tests.requests.test_telemetry_export import _baseline

NAME = re.compile(r"^pairreg_[a-z][a-z0-9_]*$")
# Units a metric name must not use: Prometheus wants base units (seconds, bytes, ratios).
NON_BASE_UNITS = ("milliseconds", "microseconds", "minutes", "hours", "kilobytes",
                  "megabytes", "percent", "_ms", "_kb", "_mb")  # fmt: skip
ALLOWED_LABELS = {"deployment", "category", "kind", "state", "handler", "method", "status",
                  "le", "pair_digest"}  # fmt: skip
NEVER_LABELS = {"request_id", "id", "token", "actor", "user", "path", "url"}
MAX_SERIES_PER_FAMILY = 300


def lint(text: str) -> dict[str, list]:  # type: ignore[type-arg]
    """promtool-style checks; returns samples by family name."""
    out: dict[str, list] = {}  # type: ignore[type-arg]
    for fam in text_string_to_metric_families(text):
        assert NAME.match(fam.name), fam.name
        assert not any(u in fam.name for u in NON_BASE_UNITS), fam.name
        assert fam.documentation, f"{fam.name} has no HELP"
        if fam.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in fam.samples), fam.name
        else:
            assert not fam.name.endswith("_total"), f"{fam.name}: _total on a {fam.type}"
        if fam.type == "info":
            assert all(s.name.endswith("_info") for s in fam.samples)
        label_sets = set()
        for s in fam.samples:
            keys = set(s.labels)
            assert not keys & NEVER_LABELS, (fam.name, keys)
            assert keys <= ALLOWED_LABELS, (fam.name, keys - ALLOWED_LABELS)
            label_sets.add(tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")))
        assert len(label_sets) <= MAX_SERIES_PER_FAMILY, fam.name
        out[fam.name] = fam.samples
    return out


def _value(samples: list, **labels: str) -> float:  # type: ignore[type-arg]
    hits = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (labels, samples)
    return float(hits[0])


@pytest.fixture
def token(home: Settings) -> str:
    return str(json.loads(home.credentials_path.read_text())["token"])


def test_scrape_needs_a_reading_token_unless_public(home: Settings, token: str) -> None:
    client = TestClient(create_app(home))
    assert client.get("/metrics").status_code == 401
    ok = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
    public = TestClient(create_app(home.model_copy(update={"metrics_public": True})))
    assert public.get("/metrics").status_code == 200


def test_domain_and_http_metrics(home: Settings, token: str, served: Served) -> None:
    s = served
    _baseline(s.url, s.pair_b, 0.60)
    _ingest(s.url, _tags(s, np.random.default_rng(4), 0.40, 600, 0))  # a drop: alarm
    client = TestClient(create_app(home))
    auth = {"Authorization": f"Bearer {token}"}
    view = client.get(f"/v1/deployments/{s.deployment}/online-alpha", headers=auth).json()
    mon = view["monitors"][0]
    assert mon["state"] == "alarmed"
    fams = lint(client.get("/metrics", headers=auth).text)

    assert _value(fams["pairreg_database_up"]) == 1.0
    info = fams["pairreg_deployment_live_pair_info"]
    assert [x.labels["pair_digest"] for x in info] == [s.pair_b]
    dep = s.deployment
    assert _value(fams["pairreg_deployment_online_acceptance_ratio"], deployment=dep) == (
        pytest.approx(mon["alpha"])
    )
    assert _value(fams["pairreg_deployment_validated_acceptance_ratio"], deployment=dep) == 0.6
    state = fams["pairreg_deployment_online_state"]
    assert _value(state, deployment=dep, state="alarmed") == 1.0
    assert _value(state, deployment=dep, state="watching") == 0.0
    assert _value(fams["pairreg_deployment_online_drop_evidence_log"], deployment=dep) == (
        pytest.approx(np.log(mon["e_value"]))
    )
    assert _value(fams["pairreg_deployment_online_tested_requests"], deployment=dep) == 600
    assert _value(fams["pairreg_drift_flags_open"], kind="workload") == 1.0
    assert _value(fams["pairreg_drift_flags_open"], kind="integrity") == 0.0
    assert _value(fams["pairreg_request_tags_ingested"]) == 600
    assert {x.labels["state"] for x in fams["pairreg_jobs"]} == {
        "queued", "running", "done", "failed"
    }  # fmt: skip
    with session_scope(s.url) as session:
        seq = session.scalar(select(func.max(AuditEvent.seq)))
    assert _value(fams["pairreg_audit_events"]) == seq
    # The HTTP instrumentation labels by route template, never by the path sent.
    http = fams["pairreg_http_requests"]
    handlers = {x.labels["handler"] for x in http}
    assert "/v1/deployments/{name}/online-alpha" in handlers
    assert not any(dep in h for h in handlers)
    assert "pairreg_http_request_duration_seconds" in fams


def test_checkpoint_age(home: Settings, token: str, served: Served) -> None:
    from registry.services import transparency

    with session_scope(served.url) as session:
        transparency.sign_log_checkpoint(session, key_path=str(home.signing_key_path), actor="t")
    client = TestClient(create_app(home))
    fams = lint(client.get("/metrics", headers={"Authorization": f"Bearer {token}"}).text)
    age = _value(fams["pairreg_audit_last_checkpoint_age_seconds"])
    assert 0.0 <= age < timedelta(hours=1).total_seconds()
    assert _value(fams["pairreg_audit_last_checkpoint_timestamp_seconds"]) > 1.7e9
