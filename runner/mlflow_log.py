"""Log one measurement as one MLflow run.

Default store: ``sqlite:///$PAIRREG_HOME/mlruns/mlflow.db`` with artifacts in
``$PAIRREG_HOME/mlruns/artifacts``. mlflow-skinny 3.17 supports the SQL store when
SQLAlchemy and Alembic are installed (they are project dependencies) and refuses the
plain file store unless ``MLFLOW_ALLOW_FILE_STORE=true``; if the SQL store cannot be
imported we fall back to the file store with that opt-in. ``MLFLOW_TRACKING_URI``
overrides the default; an explicit ``tracking_uri`` argument overrides both.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from runner.version import RUNNER_VERSION


def _home() -> Path:
    return Path(os.environ.get("PAIRREG_HOME") or Path.home() / ".pairreg")


def _sql_store_available() -> bool:
    """MLflow's SQLite store needs SQLAlchemy and Alembic installed (skinny lacks them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("alembic", "sqlalchemy"))


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite store under ``$PAIRREG_HOME/mlruns``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    root = _home() / "mlruns"
    root.mkdir(parents=True, exist_ok=True)
    if _sql_store_available():
        return f"sqlite:///{(root / 'mlflow.db').resolve()}"
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (root / "files").resolve().as_uri()


def _versions() -> dict[str, str]:
    out = {"runner": RUNNER_VERSION}
    for pkg in ("torch", "transformers", "mlflow-skinny", "tokenizers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def _flatten_metrics(result: dict[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    keys = (
        "alpha",
        "draft_acceptance_rate",
        "tau",
        "tau_theoretical",
        "expected_alpha",
        "speedup_estimate",
        "mean_acceptance_length",
    )
    groups = {**result.get("categories", {}), "overall": result.get("overall", {})}
    for cat, stats in groups.items():
        for key in keys:
            v = stats.get(key)
            if isinstance(v, int | float):
                metrics[f"{key}.{cat}"] = float(v)
        ci = stats.get("alpha_ci") or [None, None]
        if ci[0] is not None:
            metrics[f"alpha_ci_lo.{cat}"] = float(ci[0])
            metrics[f"alpha_ci_hi.{cat}"] = float(ci[1])
        for i, v in enumerate(stats.get("per_position") or []):
            if v is not None:
                metrics[f"acceptance_pos{i}.{cat}"] = float(v)
    metrics.update(economics_metrics(result.get("economics") or {}))
    return metrics


def economics_metrics(econ: dict[str, Any]) -> dict[str, float]:
    """Pair-economics figures of a measurement as MLflow metrics: measured and predicted
    speed-up at batch 1, the cost ratio c, mean step times, and the target's pass time by
    tokens verified (``economics.target_s.n<N>``)."""
    out: dict[str, float] = {}
    for key in (
        "speedup_measured",
        "speedup_predicted",
        "cost_ratio_c",
        "plain_call_s",
        "verify_call_s",
        "draft_step_s",
        "tokens_per_verify_pass",
    ):
        v = econ.get(key)
        if isinstance(v, int | float):
            out[f"economics.{key}"] = float(v)
    for n, row in ((econ.get("spec") or {}).get("target_by_tokens") or {}).items():
        if isinstance(row.get("mean_s"), int | float):
            out[f"economics.target_s.n{n}"] = float(row["mean_s"])
    for n, row in ((econ.get("spec") or {}).get("draft_by_tokens") or {}).items():
        if isinstance(row.get("mean_s"), int | float):
            out[f"economics.draft_s.k{n}"] = float(row["mean_s"])
    return out


def log_measurement(
    result: Any,
    params: dict[str, Any],
    tracking_uri: str | None = None,
    experiment: str = "pairreg",
) -> str:
    """Create one run: params (caller's, e.g. pair digest, plus settings, suite digest,
    hardware and library versions), metrics per category, the full result as an artifact.
    Returns the run id. MLflow's own deprecation noise (SQLAlchemy loader options, file
    store maintenance) is silenced here: it is not actionable for callers."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        return _log_measurement(result, params, tracking_uri, experiment)


def _log_measurement(
    result: Any,
    params: dict[str, Any],
    tracking_uri: str | None = None,
    experiment: str = "pairreg",
) -> str:
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    uri = tracking_uri or default_tracking_uri()
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        artifact_location = None
        if uri.startswith("sqlite:///"):
            artifact_location = (Path(uri[len("sqlite:///") :]).parent / "artifacts").as_uri()
        exp_id = client.create_experiment(experiment, artifact_location=artifact_location)
    else:
        exp_id = exp.experiment_id
    settings = data.get("settings", {})
    all_params: dict[str, Any] = {f"settings.{k}": v for k, v in settings.items()}
    all_params["lossy"] = data.get("lossy")
    all_params["suite_digest"] = data.get("suite_digest")
    rendering = data.get("rendering") or {}
    all_params["rendering.mode"] = rendering.get("mode")
    all_params["rendering.chat_template_digest"] = rendering.get("chat_template_digest")
    all_params["runner_version"] = data.get("runner_version", RUNNER_VERSION)
    hw = data.get("hardware", {})
    all_params["device"] = hw.get("device")
    all_params["dtype"] = settings.get("dtype")
    all_params["method"] = settings.get("method")
    all_params["k"] = settings.get("k")
    all_params["temperature"] = settings.get("temperature")
    for name, ver in _versions().items():
        all_params[f"version.{name}"] = ver
    all_params.update(params)
    run = client.create_run(exp_id, tags={"pairreg.lossy": str(data.get("lossy"))})
    run_id = run.info.run_id
    try:
        from mlflow.entities import Metric, Param

        plist = [Param(str(k), str(v)[:6000]) for k, v in all_params.items() if v is not None]
        ts = int(time.time() * 1000)
        mlist = [Metric(k, v, ts, 0) for k, v in _flatten_metrics(data).items()]
        for i in range(0, max(len(plist), len(mlist)), 100):
            client.log_batch(run_id, metrics=mlist[i : i + 100], params=plist[i : i + 100])
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "measurement.json"
            p.write_text(json.dumps(data, indent=1, sort_keys=True))
            client.log_artifact(run_id, str(p))
            pp = Path(tmp) / "prompts.json"
            pp.write_text(json.dumps(data.get("prompts", []), indent=1))
            client.log_artifact(run_id, str(pp))
        client.set_terminated(run_id, "FINISHED")
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    return run_id
