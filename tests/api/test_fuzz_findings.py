"""Regression tests for what fuzzing the API found, each as the fuzzer sent it."""

from __future__ import annotations

from pathlib import Path

from registry.db import session_scope
from registry.services.jobs import claim_job
from registry.services.pairs import register_pair
from registry.services.validation import validate_pair
from tests.api.conftest import ApiEnv
from tests.fixtures import write_fake_model


def test_tilde_source_is_a_problem_naming_source_not_a_500(api: ApiEnv) -> None:
    """``Path("~0").expanduser()`` raised "Could not determine home directory": a 500.
    A client's path is now taken literally, and confined to the artifact roots."""
    resp = api.client.post(
        "/v1/artifacts", json={"name": "a/b", "source": "~0", "role": "draft"}, headers=api.auth()
    )
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["field"] == "source" and "~0" in body["detail"]
    assert "home directory" not in body["detail"]


def test_fail_job_refuses_a_non_boolean_ok_in_integrity(api: ApiEnv, tmp_path: Path) -> None:
    """``{"integrity": [{"ok": 0, ...}]}`` was accepted (the nested report was validated
    laxly, 0 read as false) although the documented schema says boolean."""
    model = write_fake_model(tmp_path / "t")
    resp = api.client.post(
        "/v1/artifacts",
        json={"name": "acme/t", "source": str(model), "role": "target"},
        headers=api.auth(),
    )
    assert resp.status_code == 201, resp.text
    digest = resp.json()["artifact"]["manifest_digest"]
    with session_scope(api.settings.db_url) as session:
        pair = register_pair(session, target="acme/t@v1", method="prompt_lookup", k=3, actor="t")
    with session_scope(api.settings.db_url) as session:
        validate_pair(session, ref=pair.pair.pair_digest, policy="default", actor="t")
    with session_scope(api.settings.db_url) as session:
        job = claim_job(session, worker="w", actor="t")
    assert job is not None
    report = {"artifact_id": 1, "manifest_digest": digest, "path": "", "ok": 0}
    report |= {"changed": [], "missing": [], "added": []}
    body = {"worker": "w", "error": "0", "retry": True, "integrity": [report]}
    resp = api.client.post(f"/v1/jobs/{job.id}/fail", json=body, headers=api.auth())
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == "integrity.0.ok"
    body["integrity"] = [{**report, "ok": False}]
    resp = api.client.post(f"/v1/jobs/{job.id}/fail", json=body, headers=api.auth())
    assert resp.status_code == 200, resp.text
    assert resp.json()["attempts"] == 1


def test_a_time_with_no_utc_form_is_a_422_not_a_500(api: ApiEnv) -> None:
    """``0001-01-01T00:00:00+00:01`` is in year 0 once converted to UTC: the conversion on
    the way to the database overflowed (a 500). Every timestamp parameter now refuses it."""
    h = api.auth()
    resp = api.client.post("/v1/deployments", json={"name": "prod"}, headers=h)
    assert resp.status_code == 201, resp.text
    early = "0001-01-01T00:00:00+00:01"
    for url, params, field in (
        ("/v1/deployments/prod/at", {"time": early}, "time"),
        ("/v1/audit/events", {"since": early}, "since"),
        ("/v1/requests", {"until": early}, "until"),
    ):
        resp = api.client.get(url, params=params, headers=h)
        assert resp.status_code == 422, (url, resp.text)
        assert resp.json()["field"] == field and "out of range" in resp.json()["detail"]
    day_one = {"time": "0001-01-02T00:00:00Z"}
    ok = api.client.get("/v1/deployments/prod/at", params=day_one, headers=h)
    assert ok.status_code == 200 and ok.json() is None
