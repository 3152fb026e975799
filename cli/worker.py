"""``pairreg worker``: the registry's job loop with the runner's executor, wired together.

The loop itself (claim → materialise and verify → execute → record) lives in
``registry.jobloop``; the executor in ``runner.executor``. This module only builds them
from the command line and the settings.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import typer

from cli.backend import get_backend, local_backend
from cli.render import console, err_console
from registry.contract.interface import Backend
from registry.errors import InvalidInput
from registry.jobloop import (
    DEFAULT_LEASE_S,
    Executor,
    Worker,
    isolation_problems,
    worker_name,
)
from registry.settings import Settings, get_settings
from registry.trust.audit import load_private_key


def make_worker(
    backend: Backend,
    *,
    name: str | None = None,
    device: str = "auto",
    lease_s: int = DEFAULT_LEASE_S,
    settings: Settings | None = None,
    log_prefix: str = "",
    isolated: bool = False,
    signing_key: Path | None = None,
    executor: Executor | None = None,
) -> Worker:
    if executor is None:
        from runner.executor import RunnerExecutor  # torch loads only for commands that run it

        executor = RunnerExecutor()
    settings = settings or get_settings()
    return Worker(
        backend=backend,
        executor=executor,
        name=name or worker_name(),
        device=device,
        lease_s=lease_s,
        state_dir=settings.cache_dir / "verified",
        log=lambda m: err_console.print(f"{log_prefix}{m}", highlight=False),
        isolated=isolated,
        signing_key=load_private_key(signing_key) if signing_key else None,
    )


def engine_executor(engine: str, url: str | None, model: str | None) -> Executor | None:
    """The executor for ``--engine``: None for the embedded runner (built by make_worker)."""
    if engine == "runner":
        if url or model:
            raise InvalidInput("--engine-url needs --engine vllm", field="engine_url")
        return None
    if engine != "vllm":
        raise InvalidInput("--engine must be runner or vllm", field="engine")
    if not url or not url.startswith(("http://", "https://")):
        raise InvalidInput(
            "--engine vllm needs --engine-url http(s)://HOST:PORT", field="engine_url"
        )
    from runner.vllm_measure import VllmExecutor

    return VllmExecutor(url, model)


def worker_command(
    once: bool = typer.Option(False, "--once", help="Run queued jobs, then exit."),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda"),
    name: str | None = typer.Option(None, "--name", help="Worker name (default host:pid)."),
    lease: int = typer.Option(DEFAULT_LEASE_S, "--lease", help="Lease length in seconds."),
    poll: float = typer.Option(2.0, "--poll", help="Seconds between polls of an empty queue."),
    watch_interval: float = typer.Option(
        300.0, "--watch-interval", help="Seconds between Hub branch polls (0: never)."
    ),
    isolated: bool = typer.Option(
        False,
        "--isolated",
        help="Also run jobs that execute approved remote model code; refuses to start "
        "unless this process holds nothing but its token (docs/governance.md).",
    ),
    signing_key: Path | None = typer.Option(
        None,
        "--signing-key",
        help="Ed25519 private key (PEM) to sign every result with; an admin registers its "
        "public half (`pairreg worker-key add`).",
    ),
    engine: str = typer.Option(
        "runner",
        "--engine",
        help="runner: measure with the embedded runner; vllm: through the running vLLM at "
        "--engine-url, from its per-request counters (docs/engine.md).",
    ),
    engine_url: str | None = typer.Option(
        None, "--engine-url", help="The vLLM OpenAI server to measure through (--engine vllm)."
    ),
    engine_model: str | None = typer.Option(
        None, "--engine-model", help="The served model name, when vLLM serves several."
    ),
) -> None:
    """Claim measurement jobs and run them (Ctrl-C to stop)."""
    executor = engine_executor(engine, engine_url, engine_model)
    if isolated:
        problems = isolation_problems(get_settings())
        if problems:
            raise InvalidInput("not isolated: " + "; ".join(problems), field="isolated")
    backend = get_backend()
    worker = make_worker(
        backend,
        name=name,
        device=device,
        lease_s=lease,
        isolated=isolated,
        signing_key=signing_key,
        executor=executor,
    )
    where = f"engine {engine} at {engine_url}" if engine != "runner" else f"device {device}"
    console.print(f"worker {worker.name} ({backend.mode}, {where})")
    n = worker.work(once=once, poll_s=poll, watch_s=0.0 if once else watch_interval)
    console.print(f"{n} job(s) run")


def start_background_worker(settings: Settings) -> threading.Event:
    """The embedded server's in-process worker (``PAIRREG_EMBEDDED_WORKER=0`` disables it)."""
    me = f"{worker_name()}:embedded"
    # audit events name the server's worker, not its OS user
    backend = local_backend(settings, actor=f"worker:{me}")
    worker = make_worker(backend, name=me, settings=settings, log_prefix="[worker] ")
    return worker.start_background(watch_s=float(os.environ.get("PAIRREG_WATCH_INTERVAL", "300")))


def register(app: typer.Typer) -> None:
    app.command("worker")(worker_command)
