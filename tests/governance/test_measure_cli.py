"""`pairreg measure`: the runner's numbers, stored in the registry and logged to MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_measure_stores_and_logs(home, cli, tiny, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    assert cli("artifact", "add", tiny.target_v1, "--name", "tiny/target-v1",
               "--role", "target").rc == 0  # fmt: skip
    assert cli("artifact", "add", tiny.draft, "--name", "tiny/draft", "--role", "draft").rc == 0
    reg = cli("pair", "register", "--target", "tiny/target-v1@v1", "--draft", "tiny/draft@v1",
              "--method", "draft_model", "--k", "3", "--json").json()  # fmt: skip
    digest = reg["pair"]["pair_digest"]

    args = ["--categories", "code,sql", "--per-category", "3", "--max-new-tokens", "16"]
    res = cli("measure", digest[:12], *args, "--temperature", "1.0", "--seed", "5", "--json")
    assert res.rc == 0, res.err
    out = res.json()
    assert out["pair_digest"] == digest and len(out["suite_digest"]) == 64
    assert set(out["categories"]) == {"code", "sql"}
    for cat in out["categories"].values():
        for key in ("alpha", "alpha_ci", "draft_acceptance_rate", "tau", "expected_alpha",
                    "per_position", "prompts"):  # fmt: skip
            assert key in cat
        lo, hi = cat["alpha_ci"]
        assert 0.0 <= lo <= cat["alpha"] <= hi <= 1.0
        assert cat["prompts"] == 3 and len(cat["per_position"]) == 3
        assert cat["expected_alpha"] is not None  # sampling mode records Σ min(p, q)
        assert cat["draft_acceptance_rate"] <= cat["alpha"] + 1e-9
    assert len(out["prompts"]) == 6
    assert all(len(p["output_ids"]) == 16 for p in out["prompts"])
    assert out["settings"]["temperature"] == 1.0 and out["settings"]["k"] == 3

    # The registry keeps the raw counters and the MLflow run id; MLflow has the run.
    stored = cli("measurement", "show", str(out["measurement_id"]), "--json").json()
    assert stored["mlflow_run_id"] == out["mlflow_run_id"] is not None
    assert stored["suite_digest"] == out["suite_digest"]
    import mlflow

    run = mlflow.MlflowClient(tracking_uri=tracking).get_run(out["mlflow_run_id"])
    assert run.data.params["pair_digest"] == digest
    assert run.data.params["suite_digest"] == out["suite_digest"]
    assert run.data.metrics["alpha.code"] == pytest.approx(out["categories"]["code"]["alpha"])

    bad = cli("measure", digest[:12], "--suite", str(tmp_path / "missing.jsonl"))
    assert bad.rc == 2 and len(bad.err.strip().splitlines()) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_validation_gets_an_mlflow_run(home, cli, tiny, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import mlflow

    from cli.backend import local_backend
    from registry import jobloop
    from registry.db import session_scope
    from registry.services import validation as val_svc
    from runner.executor import RunnerExecutor
    from tests.governance.conftest import POLICY

    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    client = mlflow.MlflowClient(tracking_uri=tracking)
    assert cli("policy", "put", str(POLICY)).rc == 0
    assert cli("artifact", "add", tiny.target_v1, "--name", "tiny/target-v1",
               "--role", "target").rc == 0  # fmt: skip
    assert cli("artifact", "add", tiny.draft, "--name", "tiny/draft", "--role", "draft").rc == 0
    reg = cli("pair", "register", "--target", "tiny/target-v1@v1", "--draft", "tiny/draft@v1",
              "--method", "draft_model", "--k", "4", "--json").json()  # fmt: skip
    digest = reg["pair"]["pair_digest"]

    # Measured by a job: the worker that ran it logs the run.
    first = cli("validate", digest[:12], "--policy", "tiny", "--json")
    assert first.rc == 0, first.err
    run = client.get_run(first.json()["mlflow_run_id"])
    assert run.data.params["pair_digest"] == digest and run.data.params["policy"] == "tiny"
    assert run.data.metrics["passed"] == 1.0
    assert {k for k in run.data.metrics if k.startswith("gate.")} >= {
        "gate.alpha.overall", "gate.lossless", "gate.flags"
    }  # fmt: skip

    # A validation created without any CLI or worker (as through the API on a reused
    # measurement) is picked up by the workers' sweep.
    with session_scope(home.db_url) as s:
        made = val_svc.validate_pair(s, ref=digest, policy="tiny", actor="token:api")
    assert made.state == "done" and made.validation.mlflow_run_id is None
    monkeypatch.setattr(jobloop, "SWEEP_AFTER_S", 0.0)
    backend = local_backend(home)
    assert jobloop.sweep_validation_runs(backend, RunnerExecutor()) == 1
    swept = backend.get_validation(id=made.validation.id)
    assert swept.mlflow_run_id and swept.mlflow_run_id != first.json()["mlflow_run_id"]
    assert client.get_run(swept.mlflow_run_id).data.params["pair_digest"] == digest
    assert jobloop.sweep_validation_runs(backend, RunnerExecutor()) == 0  # none left
