"""Flows an edge asks for as one step: validate (and wait for the measurement), measure now,
write a drafter export.

The CLI only parses its options, wires an executor (the runner's) and renders what these
return; everything between — whose runner decides reuse, asking the registry, running the
queued job in-process when embedded, waiting for a server's worker when remote, logging the
validation's MLflow run, verifying the pair's files before a local measurement — lives here,
once. Like the job loop, this talks to the registry only through the typed backend and hands
the executor plain data; the executor is built by a factory the edge hands in, only when it
is needed (the runner loads torch).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from registry.artifacts.speculators import write_export
from registry.contract.interface import Backend
from registry.errors import InvalidInput
from registry.governance.policy import applicable_policy_name, measurement_settings, parse_policy
from registry.jobloop import Executor, Log, Materialiser, MeasureTask, Worker, record_validation_run
from registry.records.governance import (
    JobRecord,
    MeasurementRecord,
    ValidateResult,
    ValidationRecord,
)
from registry.records.requests import SpeculatorsExport


class LocalExecutor(Executor, Protocol):
    """An executor that runs on this machine and can say which suite it would measure: an
    embedded validate reuses only a measurement made by the same runner on the same prompts."""

    def suite_digest(
        self, suite_name: str, categories: list[str] | None, prompts_per_category: int
    ) -> str:
        """The digest of the prompts this executor would measure for that suite choice."""
        ...


def _say(log: Log | None, message: str) -> None:
    if log:
        log(message)


def local_identity(
    backend: Backend,
    executor: LocalExecutor,
    *,
    policy: str | None,
    policy_text: str | None,
    deployment: str | None,
) -> tuple[str, str]:
    """``(runner_version, suite_digest)`` of the executor that will measure here: the policy
    that applies (its text, else by name, else the deployment's, else ``default``) names the
    suite, the executor says which prompts that is."""
    if policy_text is not None:
        parsed = parse_policy(policy_text)
    else:
        dep_policy = backend.get_deployment(name=deployment).policy_name if deployment else None
        parsed = backend.get_policy(name=applicable_policy_name(policy, dep_policy)).parsed
    suite = parsed["suite"]
    digest = executor.suite_digest(
        suite["name"], suite["categories"], suite["prompts_per_category"]
    )
    return executor.runner_version, digest


def wait_for_job(
    backend: Backend,
    job: JobRecord,
    *,
    timeout: float,
    run_here: Callable[[JobRecord], Any] | None = None,
    log: Log | None = None,
    poll_s: float = 1.0,
) -> JobRecord:
    """The job once done or failed. ``run_here`` (embedded mode) runs a queued job in this
    process first, as a worker would; otherwise a worker elsewhere runs it and this polls."""
    deadline = time.monotonic() + timeout
    if run_here is not None and job.state == "queued" and job.isolated:
        raise InvalidInput(
            f"job {job.id} runs approved remote model code: only an isolated worker measures "
            "it (`pairreg worker --isolated` against `pairreg serve`, docs/governance.md)",
            field="isolated",
        )
    if run_here is not None and job.state == "queued":
        _say(log, f"measuring (job {job.id}) …")
        run_here(job)
    while True:
        job = backend.get_job(id=job.id)
        if job.state in ("done", "failed"):
            return job
        if time.monotonic() > deadline:
            raise InvalidInput(
                f"job {job.id} still {job.state} after {timeout:.0f}s: "
                f"see `pairreg jobs show {job.id}`",
                field="timeout",
            )
        time.sleep(poll_s)


def validate_and_wait(
    backend: Backend,
    executor: Callable[[], LocalExecutor],
    *,
    ref: str,
    policy: str | None = None,
    policy_text: str | None = None,
    deployment: str | None = None,
    device: str = "auto",
    wait: bool = True,
    timeout: float = 3600.0,
    state_dir: Path | None = None,
    log: Log | None = None,
    poll_s: float = 1.0,
) -> ValidationRecord | ValidateResult:
    """Validate ``ref`` from a matching measurement, or measure it first and then validate.

    Embedded, this machine's runner decides which measurement may be reused and measures a
    queued job itself (a worker in this process, files verified in ``state_dir``); remote,
    the server's worker measures and this waits for it. Returns the validation, its MLflow
    run logged (once); or, when ``wait`` is off and a job was queued, the queued answer.
    A failed job raises :class:`InvalidInput` naming ``pair``; one still running after
    ``timeout`` seconds, naming ``timeout``.
    """
    get_executor = functools.cache(executor)  # built once, and only when a step needs it
    embedded = backend.mode == "embedded"
    runner_version = suite_digest = None
    if embedded:
        runner_version, suite_digest = local_identity(
            backend, get_executor(), policy=policy, policy_text=policy_text, deployment=deployment
        )

    def ask() -> ValidateResult:
        return backend.validate_pair(
            ref=ref,
            policy=policy,
            policy_text=policy_text,
            deployment=deployment,
            runner_version=runner_version,
            suite_digest=suite_digest,
        )

    def run_here(job: JobRecord) -> None:
        worker = Worker(
            backend=backend, executor=get_executor(), device=device, state_dir=state_dir, log=log
        )
        worker.work(once=True, job_id=job.id)

    res = ask()
    validation: ValidationRecord | None
    if res.state == "queued":
        assert res.job is not None
        if not wait:
            return res
        job = wait_for_job(
            backend,
            res.job,
            timeout=timeout,
            run_here=run_here if embedded else None,
            log=log,
            poll_s=poll_s,
        )
        if job.state == "failed":
            raise InvalidInput(f"measurement job {job.id} failed: {job.error}", field="pair")
        vid = (job.result or {}).get("validation_id")
        # the job's own validation only when it was made for the same deployment's policy
        same = (job.args.get("validate") or {}).get("deployment") == deployment
        if vid is not None and same:
            validation = backend.get_validation(id=vid)
        else:
            validation = ask().validation
    else:
        validation = res.validation
    assert validation is not None
    return record_validation_run(backend, get_executor(), validation, log)


@dataclass(frozen=True)
class MeasuredNow:
    """A local measurement: the task run, what the executor returned, what was stored."""

    task: MeasureTask
    out: dict[str, Any]
    stored: MeasurementRecord


def measure_now(
    backend: Backend,
    executor: Callable[[], Executor],
    *,
    ref: str,
    suite: str = "default",
    categories: list[str] | None = None,
    prompts_per_category: int = 0,
    overrides: dict[str, Any] | None = None,
    device: str = "auto",
    state_dir: Path | None = None,
    verifying: Callable[[], AbstractContextManager[Any]] = nullcontext,
    measuring: Callable[[str], AbstractContextManager[Callable[[int, int], None] | None]]
    | None = None,
) -> MeasuredNow:
    """Measure a pair on this machine now and store the measurement.

    The pair's files are materialised and checked against their manifests first (inside
    ``verifying()``, e.g. a spinner), then the executor measures the plain task (inside
    ``measuring(pair_digest)``, which may yield a progress callback) and the registry stores
    what it returned.
    """
    rec = backend.get_pair(ref=ref)
    settings = measurement_settings(rec.config, overrides or {})
    dirs = Materialiser(backend, state_dir)
    with verifying():
        task = MeasureTask(
            pair_digest=rec.pair_digest,
            lossy=rec.lossy,
            settings=settings,
            suite_name=suite,
            categories=categories or None,
            prompts_per_category=prompts_per_category,
            target_dir=dirs.artifact(rec.target),
            drafter_dir=dirs.artifact(rec.drafter) if rec.drafter else None,
            device=device,
        )
    run = executor()
    with (measuring or _no_progress)(rec.pair_digest) as progress:
        out = run.measure(task, progress=progress)
    stored = backend.store_measurement(
        pair=rec.pair_digest,
        suite_name=suite,
        suite_digest=out["suite_digest"],
        settings=settings,
        runner_version=out["runner_version"],
        result=out["result"],
        mlflow_run_id=out["mlflow_run_id"],
        device=out["device"],
    )
    return MeasuredNow(task=task, out=out, stored=stored)


def _no_progress(_: str) -> AbstractContextManager[None]:
    return nullcontext()


def write_speculators_export(
    backend: Backend, *, pair: str, out_dir: Path, state_dir: Path | None = None
) -> tuple[SpeculatorsExport, list[str]]:
    """The pair's drafter written to ``out_dir`` in the speculators format: the registry's
    export (config and file list), the drafter's files materialised and verified against
    its manifest, then copied and checked again. Returns the export and the paths written."""
    export = backend.export_speculators(pair=pair)
    drafter = backend.get_artifact(ref=export.drafter_ref)
    source = Materialiser(backend, state_dir).artifact(drafter)
    written = write_export(
        export.config,
        export.files,
        out_dir,
        source,
        [e.model_dump() for e in drafter.manifest or []],
    )
    return export, written
