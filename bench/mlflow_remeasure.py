"""Webhook to re-measurement latency: an MLflow alias move until the candidate pair's
measurement job is done, with a real ``mlflow server`` and ``pairreg serve`` (its embedded
worker measures on this machine's CPU), on the tiny reference pair.

    python bench/mlflow_remeasure.py TINY_DIR MLFLOW_VENV

TINY_DIR holds target-v1, target-v2 and draft (``pairreg tiny build``); MLFLOW_VENV is a
virtual environment with ``mlflow==3.17.*`` installed (the server; see docs/lifecycle.md).
Prints one JSON line: seconds from the alias move to the version registered, to the
candidate job claimed and to the job done, and the job's outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
SECRET = "bench-mlflow-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def main() -> None:
    tiny, venv = Path(sys.argv[1]), Path(sys.argv[2])
    from cryptography.fernet import Fernet

    root = Path(tempfile.mkdtemp(prefix="pairreg-mlflow-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mport, pport = free_port(), free_port()
        menv = {**os.environ, "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
                "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
                "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode()}  # fmt: skip
        menv.pop("MLFLOW_TRACKING_URI", None)
        procs.append(subprocess.Popen(
            [str(venv / "bin" / "mlflow"), "server", "--backend-store-uri",
             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "art"),
             "--host", "127.0.0.1", "--port", str(mport), "--workers", "1"],
            env=menv, stdout=open(root / "mlflow.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True,
        ))  # fmt: skip
        mlflow_url = f"http://127.0.0.1:{mport}"
        penv = {**os.environ, "PAIRREG_HOME": str(root / "home"),
                "PAIRREG_MLFLOW_WEBHOOK_SECRET": SECRET,
                "PAIRREG_MLFLOW_TRACKING_URI": mlflow_url, "PAIRREG_MLFLOW": "0",
                "PAIRREG_WATCH_INTERVAL": "100000", "PAIRREG_EMBEDDED_WORKER": "1",
                "PAIRREG_ARTIFACT_ROOTS": os.pathsep.join([str(root / "home" / "models"),
                                                          str(tiny.resolve())])}  # fmt: skip
        for key in ("PAIRREG_URL", "PAIRREG_TOKEN", "PAIRREG_DATABASE_URL"):
            penv.pop(key, None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--port", str(pport),
             "--log-level", "warning"],
            cwd=REPO, env=penv, stdout=open(root / "pairreg.log", "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT, start_new_session=True,
        ))  # fmt: skip
        wait_http(f"{mlflow_url}/health")
        api = f"http://127.0.0.1:{pport}"
        wait_http(f"{api}/readyz")
        token = json.loads((root / "home" / "credentials").read_text())["token"]
        cenv = {**penv, "PAIRREG_URL": api, "PAIRREG_TOKEN": token}

        def cli(*args: str) -> Any:
            r = subprocess.run([sys.executable, "-m", "cli.main", *args, "--json"], cwd=REPO,
                               env=cenv, capture_output=True, text=True)  # fmt: skip
            if r.returncode != 0:
                raise RuntimeError(f"pairreg {' '.join(args)}: {r.stderr}")
            return json.loads(r.stdout)

        import mlflow
        from mlflow import MlflowClient

        mlflow.set_tracking_uri(mlflow_url)
        client = MlflowClient(mlflow_url, registry_uri=mlflow_url)
        client.create_webhook(name="pairreg", url=f"{api}/v1/mlflow/webhook",
                              events=["model_version_alias.created"], secret=SECRET)  # fmt: skip
        client.create_registered_model("tiny-target")
        cli("mlflow", "map", "tiny-target", "--lineage", "tiny/target-v1", "--alias", "champion")

        def log_version(d: Path) -> str:
            with mlflow.start_run() as run:
                mlflow.log_artifacts(str(d), artifact_path="model")
            return str(client.create_model_version(
                "tiny-target", source=f"runs:/{run.info.run_id}/model", run_id=run.info.run_id
            ).version)  # fmt: skip

        headers = {"Authorization": f"Bearer {token}"}

        def artifact(version: int) -> bool:
            r = httpx.get(f"{api}/v1/artifacts/tiny/target-v1@v{version}", headers=headers)
            return r.status_code == 200

        client.set_registered_model_alias(
            "tiny-target", "champion", log_version(tiny / "target-v1")
        )
        end = time.monotonic() + 120
        while not artifact(1):
            if time.monotonic() > end:
                raise RuntimeError("v1 never registered")
            time.sleep(0.2)
        cli("artifact", "add", str(tiny / "draft"), "--name", "tiny/draft", "--role", "draft")
        pair = cli("pair", "register", "--target", "tiny/target-v1@v1", "--draft",
                   "tiny/draft@v1", "--method", "draft_model", "--k", "4")["pair"]  # fmt: skip
        cli("policy", "put", str(REPO / "tests" / "governance" / "policy_tiny.toml"))
        cli("deployment", "create", "prod", "--policy", "tiny")
        started = time.monotonic()
        cli("validate", pair["pair_digest"], "--deployment", "prod")
        validate_s = time.monotonic() - started
        v2 = log_version(tiny / "target-v2")

        moved = time.monotonic()
        client.set_registered_model_alias("tiny-target", "champion", v2)
        marks: dict[str, float] = {}
        job: dict[str, Any] = {}
        end = time.monotonic() + 900
        while time.monotonic() < end:
            if "registered" not in marks and artifact(2):
                marks["registered"] = time.monotonic() - moved
            jobs = httpx.get(f"{api}/v1/jobs", headers=headers, params={"limit": 50}).json()
            cands = [j for j in jobs["items"] if (j.get("args") or {}).get("drift")]
            if cands:
                job = cands[0]
                if job["state"] != "queued" and "claimed" not in marks:
                    marks["claimed"] = time.monotonic() - moved
                if job["state"] in ("done", "failed"):
                    marks["done"] = time.monotonic() - moved
                    break
            time.sleep(0.2)
        flags = httpx.get(f"{api}/v1/drift", headers=headers).json()["items"]
        print(json.dumps({
            "validate_baseline_s": round(validate_s, 2),
            **{f"alias_move_to_{k}_s": round(v, 2) for k, v in marks.items()},
            "job_state": job.get("state"),
            "flags": [(f["kind"], f["severity"]) for f in flags],
        }))  # fmt: skip
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
