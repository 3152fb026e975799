"""Who may do what: the roles a token can hold and the groups operations admit.

Every operation names one of these groups in its contract (``registry.contract``), so a
permission is decided here and nowhere else; the HTTP edge enforces it and the role-matrix
test holds it to a spelled-out table.
"""

from __future__ import annotations

from typing import Literal, get_args

TokenRole = Literal["admin", "registrar", "promoter", "ingest", "auditor", "reader", "worker"]
ROLES: tuple[str, ...] = get_args(TokenRole)

ADMIN = frozenset({"admin"})
# Read the registry (artifacts, pairs, measurements, policies, deployments, jobs, flags).
READ_REGISTRY = frozenset({"admin", "registrar", "promoter", "auditor", "reader"})
# Register artifacts and pairs.
WRITE_REGISTRY = frozenset({"admin", "registrar"})
# Re-hash an artifact against its manifest (auditors check weights too).
VERIFY_ARTIFACT = frozenset({"admin", "registrar", "auditor"})
# Change what serves: policies, deployments, promotions, rollbacks, drift flags.
GOVERN = frozenset({"admin", "promoter"})
# Ask for a validation and attach its MLflow run.
VALIDATE = frozenset({"admin", "registrar", "promoter"})
# Store a measurement taken outside a job (`pairreg measure`, or a worker).
MEASURE = frozenset({"admin", "registrar", "promoter", "worker"})
# The job protocol (claim, renew, complete, fail) and the Hub watch: measurement workers.
WORKERS = frozenset({"admin", "worker"})
# Report request tags and serving telemetry; call the embedded serving endpoints.
INGEST = frozenset({"admin", "ingest"})
# Scrape GET /metrics (unless PAIRREG_METRICS_PUBLIC=true): give Prometheus a reader token.
METRICS = READ_REGISTRY
# Read the audit log and request records.
READ_AUDIT = frozenset({"admin", "auditor"})
# Any valid token: who am I, and what may I do.
ANY = frozenset(ROLES)

# The groups by name, so a client (the dashboard) can show only what its token may do
# without restating the rules: ``whoami`` lists the names whose set holds the caller's role.
CAPABILITIES: dict[str, frozenset[str]] = {
    "admin": ADMIN,
    "read_registry": READ_REGISTRY,
    "write_registry": WRITE_REGISTRY,
    "verify_artifact": VERIFY_ARTIFACT,
    "govern": GOVERN,
    "validate": VALIDATE,
    "measure": MEASURE,
    "workers": WORKERS,
    "ingest": INGEST,
    "read_audit": READ_AUDIT,
}


def capabilities(role: str) -> list[str]:
    """The capability names a role holds, sorted."""
    return sorted(name for name, admitted in CAPABILITIES.items() if role in admitted)
