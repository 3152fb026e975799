"""MLflow registry webhooks in: a real ``mlflow server`` (SQL backend) delivers
``model_version_alias.created`` to ``pairreg serve`` when an alias moves; pairreg fetches the
version from MLflow's artifact store, registers it by content digest with the MLflow model
version as provenance, and treats it as a target change (candidate pair, re-measurement job).
Forged, stale and replayed deliveries get a 401 or a no-op and change nothing."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from registry.artifacts.manifest import build_manifest
from registry.db import session_scope
from registry.errors import InvalidInput, Unauthorized
from registry.integrations.mlflow_hooks import mlflow_signature, verify_delivery
from registry.services import mlflow_sources, validation
from registry.tables import Artifact, AuditEvent, Job, MlflowDelivery
from tests.fixtures import write_fake_model
from tests.governance.helpers import (
    ACTOR,
    add_model,
    make_pair,
    put_test_policy,
    store,
    synthetic_result,
)
from tests.lifecycle.conftest import MlflowServer
from tests.serve_process import ApiServer

SECRET = "mlflow-shared-secret-for-tests"


def test_signature_matches_mlflows_own() -> None:
    """pairreg's check computes exactly what MLflow's delivery code sends."""
    from mlflow.webhooks.delivery import _generate_hmac_signature

    body = json.dumps({"entity": "model_version", "action": "created", "data": {}})
    ours = mlflow_signature(SECRET, "d-1", "1700000000", body.encode())
    assert ours == _generate_hmac_signature(SECRET, "d-1", "1700000000", body)


def _signed(body: bytes, *, secret: str = SECRET, ts: int | None = None, did: str | None = None):
    ts = int(time.time()) if ts is None else ts
    did = did or str(uuid.uuid4())
    return {
        "X-MLflow-Delivery-Id": did,
        "X-MLflow-Timestamp": str(ts),
        "X-MLflow-Signature": mlflow_signature(secret, did, str(ts), body),
        "Content-Type": "application/json",
    }


def test_verify_refuses_forged_stale_and_malformed() -> None:
    body = json.dumps(
        {"entity": "model_version_alias", "action": "created", "data": {"name": "m"}}
    ).encode()
    now = time.time()
    ok = verify_delivery(SECRET, _signed(body), body, now=now, tolerance=300)
    assert ok.event == "model_version_alias.created" and ok.data == {"name": "m"}
    for headers, b, msg in (
        (_signed(body, secret="other"), body, "does not match"),
        (_signed(body), body + b" ", "does not match"),
        (_signed(body, ts=int(now) - 301), body, "tolerance"),
        (_signed(body, ts=int(now) + 301), body, "tolerance"),
        ({"X-MLflow-Delivery-Id": "x"}, body, "required"),
    ):
        with pytest.raises(Unauthorized, match=msg):
            verify_delivery(SECRET, headers, b, now=now, tolerance=300)
    with pytest.raises(Unauthorized, match="no MLflow webhook secret"):
        verify_delivery(None, _signed(body), body, now=now, tolerance=300)
    with pytest.raises(InvalidInput):
        verify_delivery(SECRET, _signed(b"[1]"), b"[1]", now=now, tolerance=300)


def _wait(cond: Any, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("timed out")


def _state(url: str) -> tuple[int, int, int, int]:
    with session_scope(url) as s:
        return (
            s.scalar(select(func.count()).select_from(Artifact)) or 0,
            s.scalar(select(func.count()).select_from(AuditEvent)) or 0,
            s.scalar(select(func.count()).select_from(MlflowDelivery)) or 0,
            s.scalar(select(func.count()).select_from(Job)) or 0,
        )


def _log_version(client: Any, name: str, model_dir: Path) -> str:
    import mlflow

    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(model_dir), artifact_path="model")
    mv = client.create_model_version(
        name, source=f"runs:/{run.info.run_id}/model", run_id=run.info.run_id
    )
    return str(mv.version)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_alias_move_in_mlflow_becomes_a_target_change(
    db_url: str, tmp_path: Path, mlflow_server: MlflowServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow import MlflowClient

    server = ApiServer(
        db_url,
        tmp_path / "home",
        env={
            "PAIRREG_MLFLOW_WEBHOOK_SECRET": SECRET,
            "PAIRREG_MLFLOW_TRACKING_URI": mlflow_server.url,
        },
    ).start()
    try:
        with session_scope(db_url) as s:
            mlflow_sources.map_mlflow_model(
                s, registered_model="chat", lineage="acme/chat", aliases=["champion"], actor=ACTOR
            )
        monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
        mlflow.set_tracking_uri(mlflow_server.url)
        client = MlflowClient(mlflow_server.url, registry_uri=mlflow_server.url)
        client.create_webhook(
            name="pairreg",
            url=f"{server.url}/v1/mlflow/webhook",
            events=["model_version.created", "model_version_alias.created"],
            secret=SECRET,
        )
        client.create_registered_model("chat")
        t1 = write_fake_model(tmp_path / "t1", weights=b"target weights v1" * 50)
        t2 = write_fake_model(tmp_path / "t2", weights=b"target weights v2" * 50)
        v1 = _log_version(client, "chat", t1)
        client.set_registered_model_alias("chat", "champion", v1)

        def registered(version: int) -> Artifact | None:
            with session_scope(db_url) as s:
                return s.scalar(
                    select(Artifact).where(
                        Artifact.lineage == "acme/chat", Artifact.version == version
                    )
                )

        art1 = _wait(lambda: registered(1))
        assert art1.manifest_digest == build_manifest(t1).digest
        # a validated pair on v1: what a target change re-measures
        put_test_policy(db_url)
        draft = add_model(db_url, tmp_path, "acme/draft", "draft", b"d1")
        digest = make_pair(db_url, art1.id, draft)
        store(db_url, digest, synthetic_result({"code": 0.8, "prose": 0.7}))
        with session_scope(db_url) as s:
            assert (
                validation.validate_pair(
                    s, ref=digest, policy="test", runner_version="test-1", actor=ACTOR
                ).pair_status
                == "validated"
            )

        v2 = _log_version(client, "chat", t2)
        moved_at = time.monotonic()
        client.set_registered_model_alias("chat", "champion", v2)
        art2 = _wait(lambda: registered(2))
        latency = time.monotonic() - moved_at
        assert art2.manifest_digest == build_manifest(t2).digest
        assert art2.provenance["source_url"] == f"models:/chat/{v2}"
        facts = art2.provenance["attestations"]["mlflow"]
        assert facts["version"] == v2 and facts["alias"] == "champion"
        assert facts["tracking_uri"] == mlflow_server.url and facts["run_id"]
        with session_scope(db_url) as s:
            [job] = s.scalars(select(Job).where(Job.state == "queued")).all()
            assert job.args["drift"]["baseline_pair_id"]
            deliveries = mlflow_sources.list_mlflow_deliveries(s).items
        events = [(d.event, d.outcome["action"]) for d in deliveries]
        assert events == [
            ("model_version.created", "ignore"),
            ("model_version_alias.created", "registered"),
            ("model_version.created", "ignore"),
            ("model_version_alias.created", "registered"),
        ]
        assert deliveries[3].outcome["target_changed"] is True
        print(f"alias move -> version registered and re-measurement queued: {latency:.2f} s")

        # --- adversaries: nothing they send changes anything ---------------------------
        before = _state(db_url)
        hook = f"{server.url}/v1/mlflow/webhook"
        body = json.dumps(
            {
                "entity": "model_version_alias",
                "action": "created",
                "timestamp": "2026-01-01T00:00:00+00:00",
                "data": {"name": "chat", "alias": "champion", "version": v1},
            }
        ).encode()
        forged = httpx.post(hook, content=body, headers=_signed(body, secret="guess"))
        stale = httpx.post(hook, content=body, headers=_signed(body, ts=int(time.time()) - 3600))
        unsigned = httpx.post(hook, content=body, headers={"Content-Type": "application/json"})
        replayed = httpx.post(
            hook, content=body, headers=_signed(body, did=deliveries[1].delivery_id)
        )
        assert (forged.status_code, stale.status_code, unsigned.status_code) == (401, 401, 401)
        assert forged.json()["title"] and "signature" in forged.text.lower()
        assert replayed.status_code == 200 and replayed.json()["outcome"] == {"action": "replay"}
        assert _state(db_url) == before
        # a genuine new delivery for a version MLflow cannot serve: 503 (MLflow retries), no change
        gone = json.dumps(
            {"entity": "model_version_alias", "action": "created",
             "data": {"name": "chat", "alias": "champion", "version": "99"}}
        ).encode()  # fmt: skip
        r = httpx.post(hook, content=gone, headers=_signed(gone), timeout=60)
        assert r.status_code == 503, r.text
        assert _state(db_url) == before
    finally:
        server.stop()
