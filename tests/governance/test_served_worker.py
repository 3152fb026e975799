"""The embedded default end to end: `pairreg serve` with its in-process worker, CLI remote.

No separate worker process runs here: `validate` queues a measurement that the server's
background worker must run, and a target change must be measured and flagged by it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.governance.conftest import POLICY
from tests.serve_process import ApiServer

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, str]]:
    extra = {"PAIRREG_MLFLOW": "0", "PAIRREG_EMBEDDED_WORKER": "1", "HF_HUB_OFFLINE": "1"}
    srv = ApiServer(None, tmp_path / "home", env=extra).start()
    assert srv.proc is not None
    env = {**os.environ, "PAIRREG_HOME": str(srv.home), **extra}
    for key in ("PAIRREG_TOKEN", "PAIRREG_DATABASE_URL"):
        env.pop(key, None)
    try:
        yield {**env, "PAIRREG_URL": srv.url, "SERVER_PID": str(srv.proc.pid)}
    finally:
        srv.stop()


def pairreg(env: dict[str, str], *args: str) -> tuple[int, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", *args, "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        return proc.returncode, proc.stdout + proc.stderr


def test_server_worker_measures_validations_and_target_changes(served, tiny) -> None:  # type: ignore[no-untyped-def]
    env = served
    assert pairreg(env, "policy", "put", str(POLICY))[0] == 0
    rc, t = pairreg(env, "artifact", "add", tiny.target_v1, "--name", "tiny/target-v1",
                    "--role", "target")  # fmt: skip
    assert rc == 0, t
    assert pairreg(env, "artifact", "add", tiny.draft, "--name", "tiny/draft", "--role",
                   "draft")[0] == 0  # fmt: skip
    rc, reg = pairreg(env, "pair", "register", "--target", "tiny/target-v1@v1", "--draft",
                      "tiny/draft@v1", "--method", "draft_model", "--k", "4")  # fmt: skip
    assert rc == 0, reg
    digest = reg["pair"]["pair_digest"]
    assert pairreg(env, "deployment", "create", "prod", "--policy", "tiny")[0] == 0

    # The CLI only waits: the measurement runs in the server's background worker.
    rc, validation = pairreg(env, "validate", digest[:16], "--deployment", "prod")
    assert rc == 0, validation
    assert validation["passed"] is True
    rc, jobs = pairreg(env, "jobs", "list")
    assert rc == 0 and [j["state"] for j in jobs["items"]] == ["done"]
    owner = jobs["items"][0]["lease_owner"] or ""
    assert f":{env['SERVER_PID']}:" in owner, f"job ran outside the server: {owner}"
    rc, out = pairreg(env, "promote", digest[:16], "--deployment", "prod", "--reason", "r1")
    assert rc == 0, out

    rc, v2 = pairreg(env, "artifact", "add", tiny.target_v2, "--name", "tiny/target-v1",
                     "--role", "target")  # fmt: skip
    assert rc == 0 and v2["target_changed"] is True
    deadline = time.monotonic() + 180
    while True:  # the server's worker picks up the candidate's measurement on its own
        rc, flags = pairreg(env, "drift", "list", "--state", "open")
        if rc == 0 and flags["items"]:
            break
        assert time.monotonic() < deadline, "no drift flag from the server's worker"
        time.sleep(1)
    flag = flags["items"][0]
    assert flag["kind"] == "drift" and "code" in flag["summary"]
