"""The job loop: claim → materialise and verify → execute → record.

It belongs to neither edge: ``pairreg worker`` and ``pairreg serve`` only wire a backend
(embedded or remote) and an executor (the runner's) into it. The loop talks to the registry
only through the typed backend, and hands the executor plain data (:class:`MeasureTask`:
verified local directories, settings, suite choice), getting plain data back. It never
imports the runner, so the registry stays free of torch.

A worker holds no state: a job's lease is renewed from a side thread while the executor
works, and a worker that dies simply stops renewing; once the lease expires any worker takes
the job again. Results go back through ``complete_job``, which refuses a lost lease and
ignores a job already done, so a job's results are written exactly once. Files that differ
from their registered manifest fail the job without retry and open an integrity flag.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry.artifacts.materialize import IntegrityError, materialise
from registry.contract.interface import Backend
from registry.errors import Conflict, PairregError
from registry.governance.policy import settings_digest
from registry.methods import get_method
from registry.records.core import ArtifactRecord, VerifyReport
from registry.records.governance import JobRecord, ValidationRecord
from registry.settings import Settings
from registry.trust.measurement_signing import sign, statement

DEFAULT_LEASE_S = 60
SWEEP_AFTER_S = 120.0
Log = Callable[[str], None]


@dataclass(frozen=True)
class TeacherForcedTask:
    """The deterministic drift signal: the baseline's frozen continuations re-scored by the
    draft (when it is a separate model), the old target and the new target."""

    old_target_dir: str
    draft_dir: str | None
    baseline_prompts: list[dict[str, Any]]


@dataclass(frozen=True)
class MeasureTask:
    """Everything an executor needs to measure a pair: plain data, verified directories."""

    pair_digest: str
    lossy: bool
    settings: dict[str, Any]
    suite_name: str
    categories: list[str] | None
    prompts_per_category: int
    target_dir: str
    drafter_dir: str | None
    device: str = "auto"
    divergence_categories: list[str] = field(default_factory=lambda: ["adversarial"])
    teacher_forced: TeacherForcedTask | None = None
    mlflow_params: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    """What runs measurements (the runner provides one)."""

    runner_version: str

    def measure(
        self, task: MeasureTask, progress: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        """Return what ``complete_job`` takes: ``result``, ``suite_digest``,
        ``runner_version``, ``mlflow_run_id``, ``device``, ``settings`` (and
        ``teacher_forced`` when asked)."""
        ...

    def log_validation(self, validation: ValidationRecord) -> str | None:
        """Log a validation's MLflow run; its id, or None when run logging is off."""
        ...


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Materialiser:
    """Verified local directories for a worker's artifacts
    (see :mod:`registry.artifacts.materialize`)."""

    def __init__(self, backend: Backend, state_dir: Path | None, full: bool = False):
        self.backend = backend
        self.state_dir = state_dir
        self.full = full

    def artifact(self, art: ArtifactRecord) -> str:
        if art.manifest is None:  # records inside a pair omit the manifest
            art = self.backend.get_artifact(ref=str(art.id))
        return str(materialise(art, state_dir=self.state_dir, full=self.full).path)


def measure_task(backend: Backend, job: JobRecord, device: str, dirs: Materialiser) -> MeasureTask:
    """Turn a claimed ``measure`` job into plain data, materialising every artifact first."""
    args = job.args
    pair = backend.get_pair(ref=str(args["pair_id"]))
    policy = backend.get_policy(name=args["policy"])
    target_dir = dirs.artifact(pair.target)
    drafter_dir = dirs.artifact(pair.drafter) if pair.drafter else None
    teacher = None
    drift = args.get("drift")
    if drift:
        baseline = backend.get_measurement(id=int(drift["baseline_measurement_id"]))
        old = backend.get_artifact(ref=str(drift["previous_target_id"]))
        teacher = TeacherForcedTask(
            old_target_dir=dirs.artifact(old),
            # teacher-forced overlap compares two causal LMs: only a draft model has one
            draft_dir=drafter_dir if get_method(pair.method).drafter == "model" else None,
            baseline_prompts=list(baseline.prompts or []),
        )
    return MeasureTask(
        pair_digest=pair.pair_digest,
        lossy=pair.lossy,
        settings=dict(args["settings"]),
        suite_name=args["suite_name"],
        categories=args.get("categories") or None,
        prompts_per_category=int(args.get("prompts_per_category") or 0),
        target_dir=target_dir,
        drafter_dir=drafter_dir,
        device=device,
        divergence_categories=list(policy.parsed["lossy"]["adversarial_categories"]),
        teacher_forced=teacher,
        mlflow_params={"job_id": job.id, "policy": args["policy"]},
    )


class LeaseKeeper:
    """Renews a job's lease every third of its length until stopped or lost."""

    def __init__(self, backend: Backend, job_id: int, worker: str, lease_s: int):
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


def record_validation_run(
    backend: Backend, executor: Executor, validation: ValidationRecord, log: Log | None = None
) -> ValidationRecord:
    """Log a validation's MLflow run and attach it, once: a run attached meanwhile wins.

    Whoever creates a validation calls this (the CLI for reused measurements, the worker
    for the ones its jobs produce); workers also sweep up any left without one.
    """
    if validation.mlflow_run_id is not None:
        return validation
    try:
        run_id = executor.log_validation(validation)
    except Exception as exc:  # noqa: BLE001 - the validation stands without its run
        if log:
            log(f"warning: MLflow run not logged: {exc}")
        return validation
    if not run_id:
        return validation
    try:
        return backend.set_validation_run(id=validation.id, mlflow_run_id=run_id)
    except PairregError:
        return backend.get_validation(id=validation.id)


def sweep_validation_runs(backend: Backend, executor: Executor, log: Log | None = None) -> int:
    """Attach MLflow runs to validations nobody logged (e.g. validated through the API on a
    reused measurement). Only ones older than SWEEP_AFTER_S, so their creator goes first."""
    done = 0
    cutoff = datetime.now(UTC) - timedelta(seconds=SWEEP_AFTER_S)
    page = backend.list_validations(without_mlflow_run=True, limit=100)
    for validation in page.items:
        if validation.created_at <= cutoff:
            if record_validation_run(backend, executor, validation, log).mlflow_run_id:
                done += 1
    return done


@dataclass
class Worker:
    """One worker: a backend to talk to, an executor to run, where to keep its state."""

    backend: Backend
    executor: Executor
    name: str = field(default_factory=worker_name)
    device: str = "auto"
    lease_s: int = DEFAULT_LEASE_S
    state_dir: Path | None = None
    log: Log | None = None
    # Holds nothing but its token: may claim jobs that run approved remote model code.
    isolated: bool = False
    # Signs every result it hands back (its public half registered for this worker's token).
    signing_key: Ed25519PrivateKey | None = None

    def _say(self, message: str) -> None:
        if self.log:
            self.log(message)

    def claim(self, job_id: int | None = None) -> JobRecord | None:
        return self.backend.claim_job(
            worker=self.name,
            device=None if self.device == "auto" else self.device,  # type: ignore[arg-type]
            lease_seconds=self.lease_s,
            id=job_id,
            runner_version=self.executor.runner_version,
            isolated=self.isolated,
        )

    def _signed(self, job: JobRecord, result: dict[str, Any]) -> dict[str, Any]:
        """The result with this worker's signature over its canonical statement."""
        if self.signing_key is None or not isinstance(result.get("result"), dict):
            return result
        args = job.args
        stmt = statement(
            pair_digest=args["pair_digest"],
            job_id=job.id,
            suite_name=args["suite_name"],
            suite_digest=result["suite_digest"],
            settings_digest=settings_digest(result.get("settings") or args["settings"]),
            runner_version=result["runner_version"],
            result=result["result"],
        )
        return {**result, "signature": sign(self.signing_key, stmt)}

    def run_one(self, job: JobRecord) -> JobRecord:
        """Execute a claimed job and report its outcome; returns the final job record."""
        b = self.backend
        with LeaseKeeper(b, job.id, self.name, self.lease_s) as keeper:
            try:
                if job.kind != "measure":
                    raise PairregError(f"this worker cannot run jobs of kind {job.kind}")
                task = measure_task(b, job, self.device, Materialiser(b, self.state_dir))
                result = self.executor.measure(task)
            except IntegrityError as exc:
                if keeper.lost.is_set():
                    return b.get_job(id=job.id)
                return b.fail_job(
                    id=job.id,
                    worker=self.name,
                    error=str(exc),
                    retry=False,
                    integrity=[VerifyReport.model_validate(exc.report.model_dump())],
                )
            except Exception as exc:  # noqa: BLE001 - any failure is recorded on the job
                detail = str(exc) if isinstance(exc, PairregError) else traceback.format_exc(5)
                if keeper.lost.is_set():
                    return b.get_job(id=job.id)
                return b.fail_job(
                    id=job.id,
                    worker=self.name,
                    error=detail,
                    retry=not isinstance(exc, PairregError),
                )
        if keeper.lost.is_set():
            return b.get_job(id=job.id)
        try:
            final = b.complete_job(id=job.id, worker=self.name, result=self._signed(job, result))
        except Conflict:
            return b.get_job(id=job.id)  # someone else finished it after our lease lapsed
        validation_id = (final.result or {}).get("validation_id")
        if validation_id is not None:
            record_validation_run(b, self.executor, b.get_validation(id=validation_id), self.log)
        return final

    def work(
        self,
        *,
        once: bool = False,
        poll_s: float = 2.0,
        watch_s: float = 0.0,
        stop: threading.Event | None = None,
        job_id: int | None = None,
    ) -> int:
        """Claim and run jobs until stopped (with ``once``: until the queue is empty).

        Returns the number of jobs run. ``watch_s`` > 0 polls watched Hub branches that often.
        """
        stop = stop or threading.Event()
        ran = 0
        next_watch = time.monotonic() + watch_s if watch_s > 0 else None
        next_sweep = time.monotonic()
        while not stop.is_set():
            if next_watch is not None and time.monotonic() >= next_watch:
                try:
                    self.backend.watch()
                except Exception as exc:  # noqa: BLE001 - the next poll tries again
                    self._say(f"watch failed: {exc}")
                next_watch = time.monotonic() + watch_s
            job = self.claim(job_id)
            if job is None:
                if once:
                    break
                if time.monotonic() >= next_sweep:
                    try:
                        sweep_validation_runs(self.backend, self.executor, self.log)
                    except Exception as exc:  # noqa: BLE001 - the next sweep tries again
                        self._say(f"validation run sweep failed: {exc}")
                    next_sweep = time.monotonic() + 60.0
                stop.wait(poll_s)
                continue
            self._say(
                f"job {job.id} ({job.kind}) claimed, attempt {job.attempts}/{job.max_attempts}"
            )
            final = self.run_one(job)
            ran += 1
            self._say(f"job {job.id}: {final.state}" + (f" — {final.error}" if final.error else ""))
            if job_id is not None:
                break
        return ran

    def start_background(self, watch_s: float = 0.0) -> threading.Event:
        """Run :meth:`work` on a daemon thread (the embedded server's worker); set the
        returned event to stop it."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    self.work(stop=stop, watch_s=watch_s)
                except Exception as exc:  # noqa: BLE001 - keep the server's worker alive
                    self._say(f"error: {exc}")
                    stop.wait(5)

        threading.Thread(target=loop, daemon=True, name="pairreg-worker").start()
        return stop


def isolation_problems(settings: Settings) -> list[str]:
    """Why this process is not isolated enough to run remote model code (none when it is).

    A worker that runs an artifact's own Python must hold nothing that Python could steal
    beyond its worker token: it talks to the server over HTTP (``PAIRREG_URL``) with the
    token from ``PAIRREG_TOKEN``, and can read neither a database URL, nor the audit
    signing key, nor a credentials file. Run it as its own OS user (or container) with its
    own ``PAIRREG_HOME`` (docs/governance.md)."""
    problems = []
    if not settings.url:
        problems.append("PAIRREG_URL is not set: an isolated worker talks to the server only")
    if not settings.token:
        problems.append("PAIRREG_TOKEN is not set: the token comes from the environment only")
    if settings.database_url or os.environ.get("PAIRREG_DATABASE_URL"):
        problems.append("a database URL is configured (PAIRREG_DATABASE_URL)")
    for what, path in (
        ("the audit signing key", settings.signing_key_path),
        ("a credentials file", settings.credentials_path),
        ("the embedded database", settings.home_dir / "registry.db"),
    ):
        if os.access(path, os.R_OK):
            problems.append(f"{what} is readable at {path}")
    return problems
