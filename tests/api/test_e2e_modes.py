"""End to end: a real ``pairreg serve`` (uvicorn) on loopback, the CLI in remote mode, and
the same commands in embedded mode giving the same results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import run_cli
from tests.fixtures import write_fake_model
from tests.serve_process import ApiServer

TIME_KEYS = {"registered_at", "created_at", "occurred_at", "revoked_at", "last_used_at"}
ACTOR_KEYS = {"actor", "registered_by", "created_by"}
HASH_KEYS = {"root_hash"}  # the log's root covers times and actors


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in TIME_KEYS:
                out[k] = "<time>" if v is not None or k == "last_used_at" else None
            elif k in ACTOR_KEYS:
                out[k] = "<actor>"
            elif k in HASH_KEYS:
                out[k] = "<hash>"
            elif k == "secret":
                out[k] = "<secret>" if v.startswith("prt_") else v
            else:
                out[k] = _normalise(v)
        return out
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``pairreg serve`` in its own process with a fresh home (SQLite default)."""
    srv = ApiServer(None, tmp_path / "server-home", env={"HF_HUB_OFFLINE": "1"}).start()
    env = {**os.environ, "PAIRREG_HOME": str(srv.home), **srv.extra_env}
    for key in ("PAIRREG_URL", "PAIRREG_TOKEN", "PAIRREG_DATABASE_URL"):
        env.pop(key, None)
    try:
        yield {"url": srv.url, "home": srv.home, "log": srv.log, "env": env}
    finally:
        srv.stop()


def _script(target: Path, draft: Path) -> list[list[str]]:
    """A representative set of commands; each must print JSON with --json."""
    return [
        [
            "artifact",
            "add",
            str(target),
            "--name",
            "acme/t",
            "--role",
            "target",
            "--publisher",
            "acme",
            "--license",
            "apache-2.0",
        ],
        [
            "artifact",
            "add",
            str(draft),
            "--name",
            "acme/d",
            "--role",
            "draft",
            "--trained-against",
            "acme/t@v1",
        ],
        ["artifact", "add", str(target), "--name", "acme/t", "--role", "target"],
        ["artifact", "show", "acme/t@v1"],
        ["artifact", "list", "--role", "draft"],
        [
            "pair",
            "register",
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/d@latest",
            "--method",
            "draft_model",
            "--k",
            "4",
        ],
        [
            "pair",
            "register",
            "--target",
            "acme/t@v1",
            "--method",
            "prompt_lookup",
            "--k",
            "3",
            "--set",
            "prompt_lookup_max=4",
        ],
        ["pair", "show", "1"],
        ["pair", "list", "--target", "acme/t@v1", "--method", "prompt_lookup"],
        ["token", "create", "--name", "ci", "--role", "reader"],
        ["token", "list"],
        ["token", "revoke", "ci"],
        ["audit", "events", "--limit", "100"],
        ["audit", "events", "--entity-type", "pair", "--action", "pair.registered"],
        ["audit", "verify"],
    ]


ERRORS = [
    ["artifact", "show", "acme/none@v1"],
    ["pair", "register", "--target", "acme/t@v1", "--method", "draft_model", "--k", "4"],
    ["token", "create", "--name", "ci", "--role", "reader"],
    ["artifact", "add", "/no/such/dir", "--name", "x", "--role", "draft"],
]


def _run_all(commands: list[list[str]]) -> list[tuple[int, Any]]:
    out = []
    for args in commands:
        result = run_cli(*args, "--json")
        assert result.exit_code == 0, (args, result.output)
        out.append((result.exit_code, _normalise(json.loads(result.output))))
    return out


def test_cli_remote_and_embedded_agree(
    server: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = write_fake_model(tmp_path / "t")
    draft = write_fake_model(tmp_path / "d", hidden_size=32, weights=b"draft")
    script = _script(target, draft)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("PAIRREG_DATABASE_URL", raising=False)
    monkeypatch.delenv("PAIRREG_TOKEN", raising=False)

    # Remote: the CLI finds the admin token in the server's home automatically.
    monkeypatch.setenv("PAIRREG_HOME", str(server["home"]))
    monkeypatch.setenv("PAIRREG_URL", server["url"])
    remote = _run_all(script)
    remote_errors = [run_cli(*args, "--json") for args in ERRORS]

    # Embedded: a fresh home of its own, the same commands.
    monkeypatch.delenv("PAIRREG_URL")
    monkeypatch.setenv("PAIRREG_HOME", str(tmp_path / "local-home"))
    assert run_cli("init").exit_code == 0
    embedded = _run_all(script)
    embedded_errors = [run_cli(*args, "--json") for args in ERRORS]

    for args, r, e in zip(script, remote, embedded, strict=True):
        assert r == e, f"pairreg {' '.join(args)} differs between modes"
    for args, r, e in zip(ERRORS, remote_errors, embedded_errors, strict=True):
        assert r.exit_code == e.exit_code == 2, (args, r.output, e.output)

    # Spot checks that the comparison compared something real.
    added, _, again, shown = (x[1] for x in remote[:4])
    assert added["created"] is True and again["created"] is False
    assert shown["manifest"] and shown["provenance"]["publisher"] == "acme"
    assert remote[-1][1]["ok"] is True and remote[-1][1]["tree_size"] == 7
    # Actors differ by mode only: the token name remotely, the OS user locally.
    monkeypatch.setenv("PAIRREG_HOME", str(server["home"]))
    monkeypatch.setenv("PAIRREG_URL", server["url"])
    events = json.loads(run_cli("audit", "events", "--json").output)["items"]
    assert {e["actor"] for e in events[1:]} == {"token:admin"}
    assert events[0]["actor"].startswith("local:")  # the admin token minted by init


def test_remote_cli_as_a_process_and_curl_style_calls(server: dict[str, Any]) -> None:
    env = {**server["env"], "PAIRREG_URL": server["url"]}
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "audit", "verify", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    secret = json.loads((server["home"] / "credentials").read_text())["token"]
    openapi = httpx.get(f"{server['url']}/openapi.json").json()
    assert "/v1/artifacts" in openapi["paths"]
    r = httpx.get(f"{server['url']}/v1/tokens", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 200 and r.json()["items"][0]["name"] == "admin"
    r = httpx.get(f"{server['url']}/v1/tokens")
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
    printed = server["log"].read_text()
    assert f"pairreg API on {server['url']}" in printed
    assert f"admin token: {server['home'] / 'credentials'}" in printed
