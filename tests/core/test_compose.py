"""docker-compose.yml: docker cannot run here, so check the file parses and is coherent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.core.conftest import CliResult

yaml = pytest.importorskip("yaml")
ROOT = Path(__file__).resolve().parents[2]


def test_compose_production_shape(cli: Callable[..., CliResult]) -> None:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"db", "mlflow", "migrate", "api", "worker"} <= set(services)
    assert (ROOT / "Dockerfile").is_file()

    api, worker = services["api"], services["worker"]
    assert api["command"][:4] == ["pairreg", "serve", "--host", "0.0.0.0"]
    assert "/readyz" in " ".join(api["healthcheck"]["test"])
    for svc in (api, worker, services["migrate"]):
        env = svc["environment"]
        assert env["PAIRREG_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@db:5432/" in env["PAIRREG_DATABASE_URL"]
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert worker["command"][:2] == ["pairreg", "worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert api["environment"]["PAIRREG_WRITE_PROCESSES"] == "2"  # reads apart from writes

    declared = set(spec["volumes"])
    for name, svc in services.items():
        assert "healthcheck" in svc or name == "migrate", f"{name} has no health check"
        for dep in svc.get("depends_on", {}):
            assert dep in services
        for mount in svc.get("volumes", []):
            source = mount.split(":", 1)[0]
            assert source in declared, f"{name} mounts undeclared volume {source}"
    assert {"pgdata", "mlflow", "pairreg-home", "hf-cache"} <= declared

    # Every pairreg command line in the file exists, with the options it passes.
    for svc in services.values():
        cmd = svc.get("command")
        if isinstance(cmd, list) and cmd[0] == "pairreg":
            words = [w for w in cmd[1:] if not w.startswith("-")][:2]
            sub = [w for w in words if w not in ("0.0.0.0", "8000", "cuda")]
            res = cli(*sub, "--help")
            assert res.rc == 0, (cmd, res.err)
            for opt in (w for w in cmd if w.startswith("--")):
                assert opt in res.out, (cmd, opt)
