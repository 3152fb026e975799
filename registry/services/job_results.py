"""Completing a job: what each kind of job does with its results, named in one table.

A job's kind decides what its results mean: a ``measure`` job's become a measurement, then its
follow-ups (a drift comparison, a validation). :data:`COMPLETIONS` says so explicitly, rather
than a service registering itself into the job service as a side effect of being imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from registry.params import Id, WorkerName
from registry.records.governance import JobRecord
from registry.services.jobs import JOB_KINDS, check_lease, finish_job, locked_job, to_record
from registry.services.validation import complete_measure
from registry.tables import Job

# (session, job, result, actor, home_dir): home_dir from the operation's context
Completion = Callable[[Session, Job, dict[str, Any], str, str | None], dict[str, Any]]

# kind -> completion(session, job, result, actor) -> what is stored as the job's result
COMPLETIONS: dict[str, Completion] = {"measure": complete_measure}
assert set(COMPLETIONS) == set(JOB_KINDS), "every job kind needs its completion"


def complete_job(
    session: Session,
    *,
    id: Id,
    worker: WorkerName,
    result: dict[str, Any],
    actor: str,
    home_dir: str | None = None,
) -> JobRecord:
    """Write a job's results once: a done job is returned unchanged, a lost lease refused.
    ``home_dir`` (from the operation's context) is the serving process's home, whose
    hardware profiles the economics gates of a follow-up validation use."""
    job = locked_job(session, id)
    if job.state == "done":
        return to_record(job)
    check_lease(job, worker)
    outcome = COMPLETIONS[job.kind](session, job, result, actor, home_dir)
    finish_job(
        session, job, actor=actor, result=outcome, payload={"worker": worker, "result": outcome}
    )
    return to_record(job)
