"""A real ``mlflow server`` (full MLflow 3.17, SQL backend, artifact proxy) for the MLflow-in
tests, run from its own virtual environment.

Full MLflow is not a pairreg dependency: pairreg's code needs only ``mlflow-skinny`` (the
client), and the server's extra stack (Flask, pandas, pyarrow, scikit-learn, matplotlib,
about 300 MB) would otherwise land in every pairreg install and image. The server runs as a
separate process anyway, so it gets a separate venv, built once into the test cache
(``$PAIRREG_TEST_CACHE/mlflow-server-3.17``, or ``PAIRREG_MLFLOW_SERVER_VENV``) with
``pip install "mlflow==3.17.*"`` — the same network a test install already needs.

Delivering to a loopback receiver needs two settings on the MLflow side: its SSRF
protection refuses non-public peer addresses unless ``MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true``
(checked at webhook creation and again on the connected socket), and it accepts only
``https`` webhook URLs unless ``MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https``. Webhook secrets
are encrypted at rest with ``MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY`` (a Fernet key; without
one each server process makes up its own and cannot read the others' secrets).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet

from tests.prepare import mlflow_server_venv
from tests.serve_process import free_port


@dataclass
class MlflowServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    venv = mlflow_server_venv()
    port = free_port()
    root = tmp_path / "mlflow"
    root.mkdir()
    env = {
        **os.environ,
        "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
        "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
        "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(),
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    log = root / "server.log"
    proc = subprocess.Popen(
        [str(venv / "bin" / "mlflow"), "server",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start")
            time.sleep(0.2)
        yield MlflowServer(url, proc, log)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)
