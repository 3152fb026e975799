"""Who may do what: the roles a token can hold, and the duties operations belong to.

A *duty* is one kind of responsibility (register pairs, author policy, approve remote code,
produce measurements, validate, promote, audit...). Every operation names exactly one duty
in its contract (``registry.contract``), so its role set follows from the duty and a
permission is decided here and nowhere else; the HTTP edge enforces it and the duty-table
test (``tests/api/test_duties.py``) holds it to a spelled-out table.

Duties are separated on purpose: whoever builds a pair (``registrar``) cannot move the gates
it passes. Policies are authored by ``admin``/``promoter``; remote model code is approved by
``admin`` only; measurements that gates trust by default come from workers under a job
(``worker``) or from the embedded registry's own user; promotion is ``admin``/``promoter``.
A role admitted to an operation can still be refused by a rule inside it (policy text sent
to ``validate`` by a non-author, four-eyes promotion): those rules name their duty too.
"""

from __future__ import annotations

from typing import Literal, get_args

TokenRole = Literal["admin", "registrar", "promoter", "ingest", "auditor", "reader", "worker"]
ROLES: tuple[str, ...] = get_args(TokenRole)


class Duty(frozenset[str]):
    """The roles admitted to one duty, carrying the duty's name (a frozenset of roles)."""

    name: str
    summary: str

    def __new__(cls, name: str, roles: set[str] | frozenset[str], summary: str = "") -> Duty:
        unknown = set(roles) - set(ROLES)
        if unknown:
            raise ValueError(f"duty {name}: unknown roles {sorted(unknown)}")
        duty = super().__new__(cls, roles)
        duty.name = name
        duty.summary = summary
        return duty

    def __repr__(self) -> str:
        return f"Duty({self.name!r}, {sorted(self)!r})"


ADMIN = Duty("admin", {"admin"}, "tokens, retention, archives, partitions, worker keys")
READ_REGISTRY = Duty(
    "read_registry",
    {"admin", "registrar", "promoter", "auditor", "reader", "worker"},
    "read artifacts, pairs, measurements, policies, deployments, jobs, flags (workers read "
    "the pairs, policies, artifacts and baselines of the jobs they run)",
)
WRITE_REGISTRY = Duty("write_registry", {"admin", "registrar"}, "register artifacts and pairs")
VERIFY_ARTIFACT = Duty(
    "verify_artifact", {"admin", "registrar", "auditor"}, "re-hash an artifact (auditors too)"
)
AUTHOR_POLICY = Duty(
    "author_policy",
    {"admin", "promoter"},
    "store policy text (wherever it arrives) and choose a deployment's policy",
)
APPROVE_REMOTE_CODE = Duty(
    "approve_remote_code",
    {"admin"},
    "allow one artifact's own model code (by manifest digest) to run in isolated workers",
)
GOVERN = Duty(
    "govern",
    {"admin", "promoter"},
    "promote, roll back, create deployments, deprecate/retire pairs, handle drift flags",
)
VALIDATE = Duty(
    "validate", {"admin", "registrar", "promoter"}, "ask for a validation, attach its MLflow run"
)
MEASURE = Duty(
    "measure",
    {"admin", "registrar", "promoter", "worker"},
    "self-report a measurement (stored with its provenance; trusted only if a policy says so)",
)
WORKERS = Duty(
    "workers",
    {"admin", "worker"},
    "produce measurements under jobs (claim, renew, complete, fail) and poll the Hub",
)
INGEST = Duty("ingest", {"admin", "ingest"}, "report request tags and serving telemetry; serve")
READ_AUDIT = Duty("read_audit", {"admin", "auditor"}, "read the audit log and request records")
ANY = Duty("any", set(ROLES), "who am I, and what may I do")
# Scrape GET /metrics (unless PAIRREG_METRICS_PUBLIC=true): give Prometheus a reader token.
METRICS = READ_REGISTRY

DUTIES: tuple[Duty, ...] = (
    ADMIN,
    READ_REGISTRY,
    WRITE_REGISTRY,
    VERIFY_ARTIFACT,
    AUTHOR_POLICY,
    APPROVE_REMOTE_CODE,
    GOVERN,
    VALIDATE,
    MEASURE,
    WORKERS,
    INGEST,
    READ_AUDIT,
)
DUTY_BY_NAME: dict[str, Duty] = {d.name: d for d in (*DUTIES, ANY)}

# The duties by name, so a client (the dashboard) can show only what its token may do
# without restating the rules: ``whoami`` lists the names whose set holds the caller's role.
CAPABILITIES: dict[str, frozenset[str]] = {d.name: d for d in DUTIES}


def capabilities(role: str) -> list[str]:
    """The capability names a role holds, sorted."""
    return sorted(name for name, admitted in CAPABILITIES.items() if role in admitted)


def holds(role: str | None, duty: Duty) -> bool:
    """Whether ``role`` holds ``duty``; ``None`` is the embedded registry's own user (no
    token: it owns the database and every duty on it)."""
    return role is None or role in duty
