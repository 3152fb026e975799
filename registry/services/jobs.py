"""The job queue in the database: enqueue, claim under a lease, renew, finish, fail.

Workers claim with ``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL (SQLite's
``BEGIN IMMEDIATE`` makes the claim transaction exclusive already). A claim sets a lease;
a worker that dies stops renewing it, and once it expires the job is claimable again.
Completing checks that the caller still holds the lease and that the job is not done
already, so a job's results are written exactly once however many workers touched it.
What a finished job means (store a measurement, validate, compare for drift) is decided by
handlers registered per job kind, so this module knows nothing of measurements.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import Field
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from registry.canonical import digest_of
from registry.errors import Conflict, InvalidInput, NotFound
from registry.params import Cursor, Id, LeaseSeconds, Limit, WorkerName
from registry.records.core import Page, VerifyReport, from_row
from registry.records.governance import JobRecord
from registry.services.artifacts import report_verification
from registry.services.base import page_query
from registry.services.tokens import TOKEN_ACTOR
from registry.tables import Artifact, Job, Pair, Worker, utcnow
from registry.trust.audit import append_event, lock_writes

JOB_STATES = ("queued", "running", "done", "failed")
JOB_KINDS = ("measure",)
DEFAULT_LEASE_S = 60
DEFAULT_MAX_ATTEMPTS = 3


def to_record(job: Job) -> JobRecord:
    return from_row(JobRecord, job)


def enqueue(
    session: Session,
    *,
    kind: str,
    args: dict[str, Any],
    key_material: dict[str, Any],
    actor: str,
    device: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> tuple[Job, bool]:
    """Queue a job once per idempotency key; a failed job with the same key is re-queued."""
    if kind not in JOB_KINDS:
        raise InvalidInput(f"job kind must be one of {', '.join(JOB_KINDS)}", field="kind")
    key = digest_of({"kind": kind, **key_material})
    lock_writes(session)
    existing = session.scalar(select(Job).where(Job.idempotency_key == key))
    if existing is not None:
        if existing.state != "failed":
            return existing, False
        existing.state = "queued"
        existing.attempts = 0
        existing.error = None
        existing.args = args
        existing.isolated = needs_isolation(args)
        existing.lease_owner = None
        existing.lease_expires_at = None
        existing.finished_at = None
        existing.updated_at = utcnow()
        append_event(
            session,
            actor=actor,
            action="job.requeued",
            entity_type="job",
            entity_id=existing.id,
            payload={"kind": kind, "key": key},
        )
        return existing, True
    job = Job(
        kind=kind,
        args=args,
        idempotency_key=key,
        state="queued",
        device=device,
        isolated=needs_isolation(args),
        attempts=0,
        max_attempts=max_attempts,
        created_by=actor,
    )
    session.add(job)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="job.queued",
        entity_type="job",
        entity_id=job.id,
        payload={"kind": kind, "key": key, "args": args},
    )
    return job, True


def enqueue_remeasure(
    session: Session,
    *,
    args: dict[str, Any],
    key_material: dict[str, Any],
    actor: str,
    action: str,
    pair_id: int,
    payload: dict[str, Any],
) -> Job:
    """Queue a re-measurement of a pair once per key and, when it is new (or re-queued after a
    failure), say why on the pair's audit trail (``action``, ``payload`` plus the job id):
    the one way a drift check or an engine change asks for a measurement."""
    job, created = enqueue(
        session, kind="measure", args=args, key_material=key_material, actor=actor
    )
    if created:
        append_event(
            session,
            actor=actor,
            action=action,
            entity_type="pair",
            entity_id=pair_id,
            payload={**payload, "job_id": job.id},
        )
    return job


def needs_isolation(args: dict[str, Any]) -> bool:
    """A job whose settings run an artifact's own model code."""
    return bool((args.get("settings") or {}).get("trust_remote_code"))


def remote_code_refusal(session: Session, job: Job) -> str | None:
    """Why an isolated job may not run now: a part (or the previous target a drift job
    re-scores) ships its own code and no admin approved its exact bytes. Checked at claim
    time, so a job queued from a baseline's settings (a target change) cannot run new,
    unapproved code."""
    from registry.services.duties import approved_digests  # duties imports measurements

    pair = session.get(Pair, (job.args or {}).get("pair_id"))
    if pair is None:
        return None
    parts = [pair.target] + ([pair.drafter] if pair.drafter is not None else [])
    previous = ((job.args or {}).get("drift") or {}).get("previous_target_id")
    if previous is not None:
        old = session.get(Artifact, int(previous))
        if old is not None:
            parts.append(old)
    needing = [a for a in parts if (a.facts or {}).get("remote_code")]
    approved = approved_digests(session, [a.manifest_digest for a in needing])
    missing = [f"{a.lineage}@v{a.version}" for a in needing if a.manifest_digest not in approved]
    if not missing:
        return None
    return (
        "model code of " + ", ".join(missing) + " is not approved for these bytes: "
        "`pairreg artifact approve-remote-code`"
    )


def _claimable(now):  # type: ignore[no-untyped-def]
    return or_(
        Job.state == "queued",
        (Job.state == "running") & (Job.lease_expires_at < now),
    )


def claim_job(
    session: Session,
    *,
    worker: WorkerName,
    device: Literal["cpu", "cuda"] | None = None,
    kinds: list[str] | None = None,
    lease_seconds: LeaseSeconds = DEFAULT_LEASE_S,
    id: Annotated[Id | None, Field(description="Claim this job only.")] = None,
    runner_version: Annotated[
        str | None,
        Field(max_length=64, description="The runner version this worker measures with."),
    ] = None,
    isolated: Annotated[
        bool,
        Field(
            description="This worker holds nothing but its token (no signing key, "
            "credentials file or database URL): it may run approved remote model code."
        ),
    ] = False,
    actor: str,
) -> JobRecord | None:
    """Take the oldest claimable job (queued, or running with an expired lease), or None.

    ``id`` claims that job only (the CLI runs the job it just queued), if it is claimable.
    Every claim also records the worker as seen, with its runner version: validations reuse
    only measurements the workers that will measure would reproduce.
    """
    if not worker:
        raise InvalidInput("worker must name the worker", field="worker")
    if isolated and not actor.startswith(TOKEN_ACTOR):
        raise InvalidInput(
            "an embedded worker reads the database, the signing key and the credentials: "
            "only a worker that talks to the server over HTTP with a worker token claims "
            "jobs that run remote code (`pairreg worker --isolated`, PAIRREG_URL set)",
            field="isolated",
        )
    if not 1 <= lease_seconds <= 3600:
        raise InvalidInput("lease_seconds must be from 1 to 3600", field="lease_seconds")
    seen_worker(session, worker, runner_version=runner_version, device=device, actor=actor)
    while True:
        now = utcnow()
        stmt = select(Job).where(_claimable(now))
        if kinds:
            stmt = stmt.where(Job.kind.in_(kinds))
        if id is not None:
            stmt = stmt.where(Job.id == id)
        if device:
            stmt = stmt.where(or_(Job.device.is_(None), Job.device == device))
        if not isolated:
            stmt = stmt.where(Job.isolated.is_(False))
        stmt = stmt.order_by(Job.id).limit(1)
        if session.get_bind().dialect.name == "postgresql":
            stmt = stmt.with_for_update(skip_locked=True)
        job = session.scalar(stmt)
        if job is None:
            return None
        if job.attempts >= job.max_attempts:
            # Its last worker died holding it: no attempts left.
            _finish_failed(
                session,
                job,
                f"lease expired on attempt {job.attempts} "
                f"(worker {job.lease_owner} stopped renewing it)",
                actor,
            )
            continue
        why = remote_code_refusal(session, job) if job.isolated else None
        if why is not None:
            _finish_failed(session, job, why, actor)
            continue
        expired_owner = job.lease_owner if job.state == "running" else None
        job.state = "running"
        job.attempts += 1
        job.lease_owner = worker
        job.lease_expires_at = now + timedelta(seconds=lease_seconds)
        job.updated_at = now
        session.flush()
        append_event(
            session,
            actor=actor,
            action="job.claimed",
            entity_type="job",
            entity_id=job.id,
            payload={"worker": worker, "attempt": job.attempts, "taken_from": expired_owner},
        )
        return to_record(job)


# A worker that has not claimed for this long is not expected to measure the next job.
LIVE_WORKER_S = 600


def seen_worker(
    session: Session, name: str, *, runner_version: str | None, device: str | None, actor: str
) -> None:
    """Record that ``name`` is polling for work (no audit event: this is liveness, not a
    change of anything governed)."""
    now = utcnow()
    row = session.get(Worker, name)
    if row is None:
        session.add(
            Worker(
                name=name,
                runner_version=runner_version,
                device=device,
                actor=actor,
                first_seen_at=now,
                last_seen_at=now,
            )
        )
    else:
        row.last_seen_at = now
        row.actor = actor
        if runner_version is not None:
            row.runner_version = runner_version
        if device is not None:
            row.device = device
    session.flush()


def measuring_runner_versions(session: Session, device: str | None) -> list[str]:
    """Runner versions of the workers that would take a job for ``device`` now: those seen
    within ``LIVE_WORKER_S``; if none is live, the version of the worker seen last (the one
    most likely to come back). Empty when no worker ever reported a version."""
    stmt = select(Worker).where(Worker.runner_version.is_not(None))
    if device:
        stmt = stmt.where(or_(Worker.device.is_(None), Worker.device == device))
    rows = list(session.scalars(stmt.order_by(Worker.last_seen_at.desc())))
    if not rows:
        return []
    cutoff = utcnow() - timedelta(seconds=LIVE_WORKER_S)
    live = sorted({r.runner_version for r in rows if r.last_seen_at >= cutoff and r.runner_version})
    return live or [str(rows[0].runner_version)]


def locked_job(session: Session, job_id: int) -> Job:
    """Lock the job row, then the registry write lock: the same order a claim takes them
    (row first, from SKIP LOCKED), so a claimer and a completer cannot deadlock."""
    stmt = select(Job).where(Job.id == job_id)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    job = session.scalar(stmt)
    if job is None:
        raise NotFound(f"no job with id {job_id}", field="id")
    lock_writes(session)
    session.refresh(job)
    return job


def check_lease(job: Job, worker: str) -> None:
    if job.state != "running" or job.lease_owner != worker:
        raise Conflict(
            f"job {job.id} is {job.state} and leased to {job.lease_owner or 'nobody'}, "
            f"not {worker}: the lease was lost",
            field="worker",
        )


def renew_lease(
    session: Session, *, id: Id, worker: WorkerName, lease_seconds: LeaseSeconds = DEFAULT_LEASE_S
) -> JobRecord:
    job = locked_job(session, id)
    check_lease(job, worker)
    job.lease_expires_at = utcnow() + timedelta(seconds=lease_seconds)
    job.updated_at = utcnow()
    return to_record(job)


def finish_job(
    session: Session,
    job: Job,
    *,
    actor: str,
    result: dict[str, Any] | None = None,
    error: str | None = None,
    payload: dict[str, Any],
) -> None:
    """Close a job as done (``result``) or failed (``error``), and audit it: the one place a
    job leaves the running states, so done and failed keep the same bookkeeping."""
    now = utcnow()
    job.state = "failed" if error is not None else "done"
    job.result = result if error is None else job.result
    job.error = error[:4000] if error is not None else None
    job.lease_expires_at = None
    job.finished_at = now
    job.updated_at = now
    session.flush()
    append_event(
        session,
        actor=actor,
        action=f"job.{job.state}",
        entity_type="job",
        entity_id=job.id,
        payload=payload if error is None else {**payload, "error": job.error},
    )


def _finish_failed(session: Session, job: Job, error: str, actor: str) -> None:
    finish_job(session, job, actor=actor, error=error, payload={"attempts": job.attempts})


def fail_job(
    session: Session,
    *,
    id: Id,
    worker: WorkerName,
    error: Annotated[str, Field(min_length=1, max_length=20_000)],
    retry: bool = True,
    integrity: Annotated[
        list[VerifyReport] | None,
        Field(
            max_length=8,
            description="Artifacts whose files differed from their manifest on the worker.",
        ),
    ] = None,
    actor: str,
) -> JobRecord:
    """Record a failed attempt: back to the queue while attempts remain, else ``failed``.

    ``integrity`` reports files on the worker that differ from their registered manifest:
    each opens an integrity flag on its artifact (which blocks its pairs' promotion).
    """
    job = locked_job(session, id)
    if job.state == "done":
        return to_record(job)
    check_lease(job, worker)
    for report in integrity or []:
        art = session.get(Artifact, report.artifact_id)
        if art is None or art.manifest_digest != report.manifest_digest:
            raise InvalidInput(
                f"integrity report names artifact {report.artifact_id} with manifest "
                f"{report.manifest_digest[:12]}, which is not registered",
                field="integrity",
            )
        report_verification(session, art, report, actor)
    if retry and job.attempts < job.max_attempts:
        job.state = "queued"
        job.error = error[:4000]
        job.lease_owner = None
        job.lease_expires_at = None
        job.updated_at = utcnow()
        append_event(
            session,
            actor=actor,
            action="job.retry",
            entity_type="job",
            entity_id=job.id,
            payload={"error": job.error, "attempts": job.attempts},
        )
    else:
        _finish_failed(session, job, error, actor)
    return to_record(job)


def get_job(session: Session, *, id: Id) -> JobRecord:
    job = session.get(Job, id)
    if job is None:
        raise NotFound(f"no job with id {id}", field="id")
    return to_record(job)


def list_jobs(
    session: Session,
    *,
    state: str | None = None,
    kind: str | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
) -> Page[JobRecord]:
    stmt = select(Job)
    if state:
        if state not in JOB_STATES:
            raise InvalidInput(f"state must be one of {', '.join(JOB_STATES)}", field="state")
        stmt = stmt.where(Job.state == state)
    if kind:
        stmt = stmt.where(Job.kind == kind)
    rows, next_cursor = page_query(session, stmt, Job.id, cursor, limit)
    return Page[JobRecord](items=[to_record(j) for j in rows], next_cursor=next_cursor)
