"""``pairreg worker``: claim jobs through the registry, run the runner, hand numbers back.

The worker holds no state of its own: a job's lease is renewed from a side thread while
the runner works, and a worker that dies simply stops renewing; once the lease expires any
worker takes the job again. Results go back through ``complete_job``, which refuses a lost
lease and ignores a job already done, so a job's results are written exactly once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import typer

from cli import measure as measure_cli
from cli.backend import get_backend
from cli.render import console, err_console
from registry.errors import Conflict, PairregError

DEFAULT_LEASE_S = 60


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LeaseKeeper:
    """Renews a job's lease every third of its length until stopped or lost."""

    def __init__(self, backend: Any, job_id: int, worker: str, lease_s: int):
        self.backend, self.job_id, self.worker, self.lease_s = backend, job_id, worker, lease_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"lease-{job_id}")

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(max(1.0, self.lease_s / 3)):
            try:
                self.backend.renew_lease(
                    id=self.job_id, worker=self.worker, lease_seconds=self.lease_s
                )
            except Conflict:
                self.lost.set()
                return
            except Exception:  # noqa: BLE001 - a transient error: try again next period
                continue


def execute_measure(backend: Any, job: Any, device: str) -> dict[str, Any]:
    """Run a ``measure`` job's measurement (and the drift signal when it is a drift job)."""
    from cli.measure import run_measurement, teacher_forced

    args = job.args
    pair = backend.get_pair(ref=str(args["pair_id"]))
    policy = backend.get_policy(name=args["policy"])
    out = run_measurement(
        pair,
        suite_name=args["suite_name"],
        categories=args.get("categories") or None,
        prompts_per_category=int(args.get("prompts_per_category") or 0),
        settings=args["settings"],
        device=device,
        divergence_categories=policy.parsed["lossy"]["adversarial_categories"],
        mlflow_params={"job_id": job.id, "policy": args["policy"]},
    )
    prompts = out.pop("prompts")
    drift = args.get("drift")
    if drift:
        from cli.measure import local_dir

        baseline = backend.get_measurement(id=int(drift["baseline_measurement_id"]))
        old = backend.get_artifact(ref=str(drift["previous_target_id"]))
        try:
            out["teacher_forced"] = teacher_forced(
                local_dir(pair.drafter) if pair.drafter and pair.method == "draft_model" else None,
                local_dir(old),
                local_dir(pair.target),
                prompts,
                baseline.prompts or [],
                device,
            )
        except PairregError as exc:
            out["teacher_forced"] = {"error": str(exc)}
    return out


def run_one(backend: Any, job: Any, worker: str, device: str, lease_s: int) -> Any:
    """Execute a claimed job and report its outcome; returns the final job record."""
    with LeaseKeeper(backend, job.id, worker, lease_s) as keeper:
        try:
            if job.kind != "measure":
                raise PairregError(f"this worker cannot run jobs of kind {job.kind}")
            result = execute_measure(backend, job, device)
        except Exception as exc:  # noqa: BLE001 - any failure is recorded on the job
            detail = str(exc) if isinstance(exc, PairregError) else traceback.format_exc(limit=5)
            if keeper.lost.is_set():
                return backend.get_job(id=job.id)
            return backend.fail_job(
                id=job.id, worker=worker, error=detail, retry=not isinstance(exc, PairregError)
            )
    if keeper.lost.is_set():
        return backend.get_job(id=job.id)
    try:
        final = backend.complete_job(id=job.id, worker=worker, result=result)
    except Conflict:
        return backend.get_job(id=job.id)  # someone else finished it after our lease lapsed
    validation_id = (final.result or {}).get("validation_id")
    if validation_id is not None:
        measure_cli.record_validation_run(backend, backend.get_validation(id=validation_id))
    return final


SWEEP_AFTER_S = 120.0


def sweep_validation_runs(backend: Any) -> int:
    """Attach MLflow runs to validations nobody logged (e.g. validated through the API on a
    reused measurement). Only ones older than SWEEP_AFTER_S, so their creator goes first."""
    if not measure_cli.mlflow_enabled():
        return 0
    done = 0
    cutoff = datetime.now(UTC) - timedelta(seconds=SWEEP_AFTER_S)
    page = backend.list_validations(without_mlflow_run=True, limit=100)
    for validation in page.items:
        if validation.created_at <= cutoff:
            measure_cli.record_validation_run(backend, validation)
            done += 1
    return done


def work(
    backend: Any,
    *,
    worker: str,
    device: str = "auto",
    once: bool = False,
    poll_s: float = 2.0,
    lease_s: int = DEFAULT_LEASE_S,
    watch_s: float = 0.0,
    stop: threading.Event | None = None,
    job_id: int | None = None,
    log: Any = None,
) -> int:
    """Claim and run jobs until stopped (or, with ``once``, until the queue is empty).

    Returns the number of jobs run. ``watch_s`` > 0 polls watched Hub branches that often.
    """
    stop = stop or threading.Event()
    ran = 0
    next_watch = time.monotonic() + watch_s if watch_s > 0 else None
    next_sweep = time.monotonic()
    dev_filter = None if device == "auto" else device
    while not stop.is_set():
        if next_watch is not None and time.monotonic() >= next_watch:
            try:
                backend.watch()
            except Exception as exc:  # noqa: BLE001 - the next poll tries again
                if log:
                    log(f"watch failed: {exc}")
            next_watch = time.monotonic() + watch_s
        job = backend.claim_job(worker=worker, device=dev_filter, lease_seconds=lease_s, id=job_id)
        if job is None:
            if once:
                break
            if time.monotonic() >= next_sweep:
                try:
                    sweep_validation_runs(backend)
                except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                    if log:
                        log(f"validation run sweep failed: {exc}")
                next_sweep = time.monotonic() + 60.0
            stop.wait(poll_s)
            continue
        if log:
            log(f"job {job.id} ({job.kind}) claimed, attempt {job.attempts}/{job.max_attempts}")
        final = run_one(backend, job, worker, device, lease_s)
        ran += 1
        if log:
            log(f"job {job.id}: {final.state}" + (f" — {final.error}" if final.error else ""))
        if job_id is not None:
            break
    return ran


def worker_command(
    once: bool = typer.Option(False, "--once", help="Run queued jobs, then exit."),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda"),
    name: str | None = typer.Option(None, "--name", help="Worker name (default host:pid)."),
    lease: int = typer.Option(DEFAULT_LEASE_S, "--lease", help="Lease length in seconds."),
    poll: float = typer.Option(2.0, "--poll", help="Seconds between polls of an empty queue."),
    watch_interval: float = typer.Option(
        300.0, "--watch-interval", help="Seconds between Hub branch polls (0: never)."
    ),
) -> None:
    """Claim measurement jobs and run them (Ctrl-C to stop)."""
    backend = get_backend()
    me = name or worker_name()
    console.print(f"worker {me} ({backend.mode}, device {device})")
    n = work(
        backend,
        worker=me,
        device=device,
        once=once,
        poll_s=poll,
        lease_s=lease,
        watch_s=0.0 if once else watch_interval,
        log=lambda m: err_console.print(m, highlight=False),
    )
    console.print(f"{n} job(s) run")


def start_background_worker(settings: Any) -> threading.Event:
    """The embedded server's in-process worker (``PAIRREG_EMBEDDED_WORKER=0`` disables it)."""
    from cli.backend import local_backend

    stop = threading.Event()
    me = f"{worker_name()}:embedded"
    # audit events name the server's worker, not its OS user
    backend = local_backend(settings, actor=f"worker:{me}")
    watch_s = float(os.environ.get("PAIRREG_WATCH_INTERVAL", "300"))

    def loop() -> None:
        while not stop.is_set():
            try:
                work(
                    backend,
                    worker=me,
                    stop=stop,
                    watch_s=watch_s,
                    log=lambda m: err_console.print(f"[worker] {m}", highlight=False),
                )
            except Exception as exc:  # noqa: BLE001 - keep the server's worker alive
                err_console.print(f"[worker] error: {exc}")
                stop.wait(5)

    threading.Thread(target=loop, daemon=True, name="pairreg-worker").start()
    return stop


def register(app: typer.Typer) -> None:
    app.command("worker")(worker_command)
