"""What a deployment checks about how its live pair is served (registry/services/serving.py),
on recorded engine payloads: the /v1/models card and /version of a scraped vLLM against the
live pair as exported (a difference opens one ``serving`` flag naming each field), an engine
version other than the validated measurement's (a re-measurement queued once), the
``serving_config`` gate, and the EAGLE-3 auxiliary layers an export carries (vLLM #50170)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from registry.db import session_scope
from registry.errors import InvalidInput
from registry.services import artifacts as art_svc
from registry.services import exports, serving
from registry.services import pairs as pair_svc
from registry.services import telemetry as svc
from registry.services.policies import load_policy
from registry.settings import Settings
from registry.tables import DriftFlag, Job, Measurement, Pair, Validation
from tests.core.test_speculators import REDHAT_EAGLE3, _head_dir, _target
from tests.requests.conftest import ACTOR, Served, promote_at
from tests.requests.test_telemetry_export import metrics


def models_payload(served_name: str, root: str, parent: str | None = None) -> dict[str, Any]:
    """vLLM 0.32's /v1/models answer, as recorded from the engine tier's server."""
    return {
        "object": "list",
        "data": [{
            "id": served_name, "object": "model", "created": 1796320000, "owned_by": "vllm",
            "root": root, "parent": parent, "max_model_len": 1024,
            "permission": [{"id": "modelperm-0", "object": "model_permission",
                            "allow_sampling": True, "is_blocking": False}],
        }],
    }  # fmt: skip


def _scrape(s: Served, payload: dict[str, Any] | None, version: str | None, n: float = 1) -> Any:
    report = serving.card_fields(payload, s.deployment) if payload else {}
    with session_scope(s.url) as session:
        return svc.ingest_prometheus(
            session, deployment=s.deployment, text=metrics(n, 4 * n, 3 * n), source="test",
            engine_version=version, actor=ACTOR, **report,
        )  # fmt: skip


def _serving_flags(url: str) -> list[DriftFlag]:
    with session_scope(url) as session:
        rows = session.scalars(select(DriftFlag).where(DriftFlag.kind == "serving")).all()
        session.expunge_all()
        return list(rows)


def test_card_fields_from_a_recorded_payload() -> None:
    payload = models_payload("chat-prod", "/models/target/")
    assert serving.card_fields(payload, "chat-prod") == {
        "served_model": "chat-prod", "served_root": "/models/target/", "served_parent": None,
        "max_model_len": 1024,
    }  # fmt: skip
    # several cards: the one named as the deployment, else the first
    two = {"data": [*models_payload("other", "/a")["data"], *payload["data"]]}
    assert serving.card_fields(two, "chat-prod")["served_root"] == "/models/target/"
    assert serving.card_fields(two, "nope")["served_model"] == "other"
    assert serving.card_fields({"data": []}, "chat-prod") == {}


def test_engine_differences_name_each_field() -> None:
    expected = {"served_model": "chat-prod", "root": "/m/t1", "parent": None,
                "engine": "vllm", "engine_version": "0.32.0"}  # fmt: skip
    same = serving.reported_engine(served_model="chat-prod", root="/m/t1/", parent=None,
                                   max_model_len=1024, engine_version="0.32.0")  # fmt: skip
    fields = {"served_model", "root", "parent", "engine_version"}
    assert serving.engine_differences(expected, same, reported_fields=fields) == []
    other = {**same, "root": "/m/t2", "parent": "/m/t1", "engine_version": "0.33.1"}
    assert serving.engine_differences(expected, other, reported_fields=fields) == [
        {"field": "root", "expected": "/m/t1", "reported": "/m/t2"},
        {"field": "parent", "expected": None, "reported": "/m/t1"},
        {"field": "engine_version", "expected": "0.32.0", "reported": "0.33.1"},
    ]
    # what the engine did not say is not compared; a runner-validated pair has no version
    assert serving.engine_differences(expected, other, reported_fields={"served_model"}) == []
    runner = {**expected, "engine": "runner", "engine_version": "1.0"}
    assert serving.engine_differences(runner, same, reported_fields=fields) == []


def test_engine_serving_another_target_opens_one_serving_flag(
    served: Served, tmp_path: Path
) -> None:
    s = served
    as_exported = _scrape(s, models_payload(s.deployment, str(s.target_dir)), "0.32.0")
    assert as_exported.serving is not None and as_exported.serving.differences == []
    assert not as_exported.serving.flagged and _serving_flags(s.url) == []
    assert as_exported.serving.expected["root"] == str(s.target_dir)

    # target-v2 swapped in behind the same served name
    v2 = str(tmp_path / "target-v2")
    swapped = _scrape(s, models_payload(s.deployment, v2), "0.32.0", n=2)
    check = swapped.serving
    assert check is not None and check.flagged and check.flag_id is not None
    assert [d.model_dump() for d in check.differences] == [
        {"field": "root", "expected": str(s.target_dir), "reported": v2}
    ]
    assert check.remeasure_job_id is None  # no validated engine measurement to hold it to
    again = _scrape(s, models_payload("other-name", v2), "0.32.0", n=3)
    assert again.serving is not None and again.serving.flag_id == check.flag_id  # one open flag
    assert {d.field for d in again.serving.differences} == {"served_model", "root"}
    flags = _serving_flags(s.url)
    assert len(flags) == 1 and flags[0].state == "open" and flags[0].severity == "high"
    with session_scope(s.url) as session:
        live = session.scalar(select(Pair).where(Pair.pair_digest == s.pair_b))
        assert live is not None and flags[0].pair_id == live.id
    assert flags[0].effects["differences"] == [
        {"field": "root", "expected": str(s.target_dir), "reported": v2}
    ]
    assert f"root: expected {s.target_dir}, reported {v2}" in flags[0].summary
    # a scrape without the engine's own report checks nothing
    plain = _scrape(s, None, None, n=4)
    assert plain.serving is None


def _validated_on(url: str, digest: str, deployment: str, serving_config: dict[str, Any]) -> int:
    """A passing validation of the pair under the default policy whose measurement recorded
    ``serving_config``; returns the measurement id."""
    with session_scope(url) as session:
        pair = session.scalar(select(Pair).where(Pair.pair_digest == digest))
        assert pair is not None
        m = Measurement(
            pair_id=pair.id, suite_name="default", suite_digest="0" * 64, settings={},
            settings_digest="0" * 64, runner_version="test", hardware={}, alpha=0.7,
            overall={"draft_acceptance_rate": 0.75}, categories={}, prompts=[],
            extra={"serving_config": serving_config}, created_by=ACTOR,
        )  # fmt: skip
        session.add(m)
        session.flush()
        pol = load_policy(session, "default", actor=ACTOR)
        session.add(Validation(
            pair_id=pair.id, policy_id=pol.id, policy_name=pol.name, policy_digest=pol.digest,
            measurement_id=m.id, deployment=deployment, gates=[], passed=True, actor=ACTOR,
        ))  # fmt: skip
        return int(m.id)


VALIDATED = {
    "engine": "vllm", "engine_version": "0.32.0", "method": "draft_model", "k": 3,
    "dtype": "float32", "acceptance": "strict", "chat_template_digest": None,
    "eagle3_aux_layer_ids": None,
}  # fmt: skip


def test_another_engine_version_queues_one_remeasurement(served: Served) -> None:
    s = served
    m_id = _validated_on(s.url, s.pair_b, s.deployment, VALIDATED)
    same = _scrape(s, models_payload(s.deployment, str(s.target_dir)), "0.32.0")
    assert same.serving is not None and not same.serving.differences
    assert same.serving.expected["engine_version"] == "0.32.0"
    newer = _scrape(s, models_payload(s.deployment, str(s.target_dir)), "0.33.0", n=2)
    check = newer.serving
    assert check is not None and check.flagged and check.remeasure_job_id is not None
    assert [d.model_dump() for d in check.differences] == [
        {"field": "engine_version", "expected": "0.32.0", "reported": "0.33.0"}
    ]
    again = _scrape(s, models_payload(s.deployment, str(s.target_dir)), "0.33.0", n=3)
    assert again.serving is not None and again.serving.remeasure_job_id == check.remeasure_job_id
    with session_scope(s.url) as session:
        jobs = session.scalars(select(Job).where(Job.kind == "measure")).all()
        assert [j.id for j in jobs] == [check.remeasure_job_id]  # once per version
        assert jobs[0].args["pair_digest"] == s.pair_b
        assert jobs[0].args["validate"] == {"policy": "default", "deployment": s.deployment}
    (flag,) = _serving_flags(s.url)
    assert flag.severity == "medium" and flag.effects["validated_measurement_id"] == m_id
    assert flag.effects["remeasure_job_id"] == check.remeasure_job_id


def test_serving_config_gate_names_the_field(served: Served) -> None:
    s = served
    with session_scope(s.url) as session:
        pair = session.scalar(select(Pair).where(Pair.pair_digest == s.pair_b))
        assert pair is not None
        m = Measurement(id=10_001, extra={"serving_config": VALIDATED})
        ok = serving.serving_config_gate(pair, m)
        assert ok.passed and ok.measured == "same" and ok.name == "serving_config"
        other = Measurement(
            id=10_002, extra={"serving_config": {**VALIDATED, "k": 4, "dtype": "bfloat16"}}
        )
        bad = serving.serving_config_gate(pair, other)
        assert not bad.passed
        assert bad.measured == "k: served 3, measured 4; dtype: served float32, measured bfloat16"
        unknown = serving.serving_config_gate(pair, Measurement(id=10_003, extra={}))
        assert unknown.passed and unknown.measured == "not recorded"


def test_config_differences_on_recorded_measurements() -> None:
    expected = {**VALIDATED, "method": "eagle3", "eagle3_aux_layer_ids": [1, 2, 3],
                "chat_template_digest": "sha256:aa"}  # fmt: skip
    issue_50170 = {**expected, "eagle3_aux_layer_ids": [0, 1, 2]}
    assert serving.config_differences(issue_50170, expected) == [
        {"field": "eagle3_aux_layer_ids", "expected": [1, 2, 3], "reported": [0, 1, 2]}
    ]
    template = {**expected, "chat_template_digest": "sha256:bb"}
    assert [d["field"] for d in serving.config_differences(template, expected)] == [
        "chat_template_digest"
    ]
    # a field the measurement did not record is not compared
    assert serving.config_differences({**expected, "chat_template_digest": None}, expected) == []


def test_eagle3_exports_carry_the_measured_layers(db_url: str, tmp_path: Path) -> None:
    """``export speculators`` writes the layers the validated measurement ran with into the
    head's config.json (vLLM reads them there and reports them nowhere) and refuses a head
    that declares others; ``export vllm`` refuses a head that declares none once a
    measurement ran with explicit ones (the engine would choose)."""
    head = _head_dir(tmp_path / "e3", REDHAT_EAGLE3)  # declares no layers: the default
    with session_scope(db_url) as s:
        t = art_svc.add_artifact(s, source=str(_target(tmp_path / "t")), name="acme/t",
                                 role="target", actor=ACTOR).artifact  # fmt: skip
        h = art_svc.add_artifact(s, source=str(head), name="acme/e3", role="heads",
                                 actor=ACTOR).artifact  # fmt: skip
        pair = pair_svc.register_pair(s, target=t.ref, draft=h.ref, method="eagle3", k=3,
                                      actor=ACTOR).pair  # fmt: skip
        # before any measurement: nothing to hold the head to
        plain = exports.export_speculators(s, pair=pair.pair_digest)
        assert "eagle_aux_hidden_state_layer_ids" not in plain.config
    promote_at(db_url, "e3-prod", pair.pair_digest, datetime.now(UTC))
    measured = {**VALIDATED, "method": "eagle3", "eagle3_aux_layer_ids": [2, 16, 29]}
    _validated_on(db_url, pair.pair_digest, "e3-prod", measured)
    with session_scope(db_url) as s:
        out = exports.export_speculators(s, pair=pair.pair_digest)
    assert out.config["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    assert out.config["pairreg"]["eagle3_aux_layer_ids"]["ids"] == [2, 16, 29]
    with session_scope(db_url) as s, pytest.raises(InvalidInput) as exc:
        exports.export_serving(s, deployment="e3-prod", engine="vllm")
    assert exc.value.field == "eagle3_aux_layer_ids"
    assert "declares no target layers" in str(exc.value) and "[2, 16, 29]" in str(exc.value)

    # vLLM #50170's case: the head on disk declares other layers than were measured
    cfg = json.loads((head / "config.json").read_text())
    with session_scope(db_url) as s:
        row = s.scalar(select(Pair).where(Pair.pair_digest == pair.pair_digest))
        assert row is not None
        with pytest.raises(InvalidInput) as exc2:
            serving.measured_aux_layer_ids(
                row, serving.pair_validated_measurement(s, row),
                {**cfg, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]},
            )  # fmt: skip
    assert exc2.value.field == "eagle3_aux_layer_ids"
    assert "declares target layers [0, 1, 2]" in str(exc2.value)
    assert "ran with [2, 16, 29]" in str(exc2.value)


def test_engine_report_over_http(home: Settings, served: Served) -> None:
    """The engine's report travels as query parameters beside the text body; a bad one is
    a 422 naming it."""
    token = json.loads(home.credentials_path.read_text())["token"]
    client = TestClient(create_app(home))
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
    params = {
        "deployment": served.deployment, "served_model": served.deployment,
        "served_root": "/elsewhere/target-v2", "engine_version": "0.32.0",
    }  # fmt: skip
    r = client.post("/v1/telemetry/prometheus", params=params, headers=auth,
                    content=metrics(1, 4, 2))  # fmt: skip
    assert r.status_code == 200, r.text
    check = r.json()["serving"]
    assert check["flagged"] and check["differences"] == [
        {"field": "root", "expected": str(served.target_dir), "reported": "/elsewhere/target-v2"}
    ]
    bad = client.post("/v1/telemetry/prometheus", headers=auth, content=metrics(2, 8, 4),
                      params={**params, "max_model_len": "0"})  # fmt: skip
    assert bad.status_code == 422 and bad.json()["field"] == "max_model_len", bad.text
