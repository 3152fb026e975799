"""Run ``pairreg serve`` as a real subprocess: end-to-end, remote-mode and fault tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from registry.db import session_scope
from registry.services.tokens import create_token

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mint(url: str, role: str = "ingest", name: str = "tagger") -> str:
    with session_scope(url) as session:
        return create_token(session, name=name, role=role, actor="test").secret


class ApiServer:
    """``pairreg serve`` on a port, in its own process group (so it can be SIGKILLed).

    ``db_url`` None means the embedded default (SQLite in ``home``); ``env`` adds or
    overrides variables (e.g. ``PAIRREG_EMBEDDED_WORKER=1``).
    """

    def __init__(
        self,
        db_url: str | None,
        home: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.db_url = db_url
        self.home = home
        self.port = port or free_port()
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ApiServer:
        env = {**os.environ, "PAIRREG_HOME": str(self.home), "PAIRREG_EMBEDDED_WORKER": "0"}
        for key in ("PAIRREG_URL", "PAIRREG_TOKEN", "PAIRREG_DATABASE_URL"):
            env.pop(key, None)
        if self.db_url is not None:
            env["PAIRREG_DATABASE_URL"] = self.db_url
        env.update(self.extra_env)
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--port", str(self.port),
             "--log-level", "warning"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not start in time")

    def kill(self) -> None:
        """SIGKILL: no shutdown handlers, no flush, exactly like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
