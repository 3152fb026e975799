"""Who may call what: the declared role for every route the app serves.

``test_roles`` walks the app's routes and fails for any route missing here (and for any
entry here that no longer exists), so adding a route means adding its line. Roles come
from the issue: ``admin`` everything; ``registrar`` artifacts and pairs; ``promoter``
validate, promote, rollback, acknowledge drift; ``ingest`` request tags only; ``auditor``
read everything including audit and requests; ``reader`` read the registry, not requests
or audit; ``worker`` the job protocol (claim, renew, complete, fail), the Hub watch,
reading the registry its jobs need and
storing measurements. The sets are spelled out rather than imported from
``registry.governance.roles`` so that a
change there shows up as a failing test, not as a silently widened permission.
"""

from __future__ import annotations

PUBLIC: frozenset[str] = frozenset()  # no token needed
# Authenticated by an HMAC signature instead of a token (tests/lifecycle/test_mlflow_in.py).
SIGNED: frozenset[str] = frozenset({"signed"})

ADMIN_ONLY = frozenset({"admin"})
# workers read the pairs, policies, artifacts and baselines of the jobs they run
READ_REGISTRY = frozenset({"admin", "registrar", "promoter", "auditor", "reader", "worker"})
WRITE_REGISTRY = frozenset({"admin", "registrar"})
VERIFY_ARTIFACT = frozenset({"admin", "registrar", "auditor"})
GOVERN = frozenset({"admin", "promoter"})
VALIDATE = frozenset({"admin", "registrar", "promoter"})  # validation / measurement jobs
MEASURE = frozenset({"admin", "registrar", "promoter", "worker"})  # store a measurement
WORKERS = frozenset({"admin", "worker"})  # the job protocol and the Hub watch
INGEST = frozenset({"admin", "ingest"})
READ_AUDIT = frozenset({"admin", "auditor"})
ANY_TOKEN = frozenset(
    {"admin", "registrar", "promoter", "ingest", "auditor", "reader", "worker"}
)  # whoami

# (method, path template as FastAPI declares it) -> roles admitted; PUBLIC = no auth.
ROLE_TABLE: dict[tuple[str, str], frozenset[str]] = {
    # framework and probes
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,  # Swagger UI, every asset from this origin
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/"): PUBLIC,  # redirect to the dashboard
    ("GET", "/dashboard"): PUBLIC,  # static page; it calls the API with the user's token
    # Prometheus: a registry-reading token (PAIRREG_METRICS_PUBLIC=true serves it openly)
    ("GET", "/metrics"): READ_REGISTRY,
    ("GET", "/dashboard/static/{path:path}"): PUBLIC,  # its CSS, JavaScript, vendored uPlot
    # artifacts
    ("POST", "/v1/artifacts"): WRITE_REGISTRY,
    ("GET", "/v1/artifacts"): READ_REGISTRY,
    ("POST", "/v1/artifacts/{ref:path}/verify"): VERIFY_ARTIFACT,
    ("GET", "/v1/artifacts/{ref:path}"): READ_REGISTRY,
    ("POST", "/v1/artifacts/{ref:path}/approve-remote-code"): ADMIN_ONLY,  # remote code
    # pairs
    ("POST", "/v1/pairs"): WRITE_REGISTRY,
    ("GET", "/v1/pairs"): READ_REGISTRY,
    ("GET", "/v1/pairs/{ref}"): READ_REGISTRY,
    ("GET", "/v1/pairs/proposal"): READ_REGISTRY,
    ("GET", "/v1/pairs/{pair}/speculators"): READ_REGISTRY,
    ("GET", "/v1/pairs/{pair}/economics"): READ_REGISTRY,
    ("GET", "/v1/hardware"): READ_REGISTRY,
    ("POST", "/v1/pairs/{ref}/deprecate"): GOVERN,
    ("POST", "/v1/pairs/{ref}/retire"): GOVERN,
    # audit log
    ("GET", "/v1/audit/events"): READ_AUDIT,
    ("GET", "/v1/audit/verify"): READ_AUDIT,
    ("POST", "/v1/audit/verify"): READ_AUDIT,
    ("GET", "/v1/audit/proofs/inclusion"): READ_AUDIT,
    ("GET", "/v1/audit/proofs/consistency"): READ_AUDIT,
    ("POST", "/v1/audit/log-checkpoints"): READ_AUDIT,
    ("GET", "/v1/audit/log-checkpoints/latest"): READ_AUDIT,
    # retention
    ("GET", "/v1/retention"): READ_AUDIT,
    ("PUT", "/v1/retention"): ADMIN_ONLY,
    # tokens
    ("POST", "/v1/tokens"): ADMIN_ONLY,
    ("GET", "/v1/tokens"): ADMIN_ONLY,
    ("GET", "/v1/whoami"): ANY_TOKEN,
    ("DELETE", "/v1/tokens/{name}"): ADMIN_ONLY,
    ("GET", "/v1/pairs/{pair}/k-schedule"): READ_REGISTRY,
    ("GET", "/v1/pairs/{pair}/acceptance-curve"): READ_REGISTRY,
    ("POST", "/v1/acceptance-curves"): MEASURE,
    # MLflow in
    ("POST", "/v1/mlflow/sources"): WRITE_REGISTRY,
    ("GET", "/v1/mlflow/sources"): READ_REGISTRY,
    ("GET", "/v1/mlflow/deliveries"): READ_AUDIT,
    ("POST", "/v1/mlflow/webhook"): SIGNED,
    # outgoing webhooks
    ("POST", "/v1/webhooks"): ADMIN_ONLY,
    ("GET", "/v1/webhooks"): ADMIN_ONLY,
    ("GET", "/v1/webhooks/{name}"): ADMIN_ONLY,
    ("POST", "/v1/webhooks/{name}/disable"): ADMIN_ONLY,
    ("POST", "/v1/webhooks/{name}/enable"): ADMIN_ONLY,
    ("GET", "/v1/webhooks/{name}/deliveries"): ADMIN_ONLY,
    # governance: measurements, jobs, drift, watch
    ("POST", "/v1/measurements"): MEASURE,
    ("GET", "/v1/measurements"): READ_REGISTRY,
    ("GET", "/v1/measurements/{id}"): READ_REGISTRY,
    ("POST", "/v1/measurements/{id}/verify"): READ_REGISTRY,
    ("POST", "/v1/worker-keys"): ADMIN_ONLY,
    ("GET", "/v1/worker-keys"): READ_REGISTRY,
    ("GET", "/v1/jobs"): READ_REGISTRY,
    ("GET", "/v1/jobs/{id}"): READ_REGISTRY,
    ("POST", "/v1/jobs/claim"): WORKERS,
    ("POST", "/v1/jobs/{id}/renew"): WORKERS,
    ("POST", "/v1/jobs/{id}/complete"): WORKERS,
    ("POST", "/v1/jobs/{id}/fail"): WORKERS,
    ("GET", "/v1/drift"): READ_REGISTRY,
    ("GET", "/v1/drift/{id}"): READ_REGISTRY,
    ("POST", "/v1/drift/{id}/ack"): GOVERN,
    ("POST", "/v1/drift/{id}/resolve"): GOVERN,
    ("POST", "/v1/drift/check"): GOVERN,
    ("POST", "/v1/watch"): WORKERS,
    # governance: policies, validations, deployments
    ("POST", "/v1/policies"): GOVERN,  # the author_policy duty: the same roles
    ("GET", "/v1/policies"): READ_REGISTRY,
    ("GET", "/v1/policies/{name}"): READ_REGISTRY,
    ("POST", "/v1/pairs/{ref}/validate"): VALIDATE,
    ("GET", "/v1/validations"): READ_REGISTRY,
    ("GET", "/v1/validations/{id}"): READ_REGISTRY,
    ("POST", "/v1/validations/{id}/mlflow-run"): VALIDATE,
    ("POST", "/v1/deployments"): GOVERN,
    ("GET", "/v1/deployments"): READ_REGISTRY,
    ("GET", "/v1/deployments/{name}"): READ_REGISTRY,
    ("GET", "/v1/deployments/{name}/online-alpha"): READ_REGISTRY,
    ("GET", "/v1/deployments/{name}/at"): READ_REGISTRY,
    ("POST", "/v1/deployments/{deployment}/promote"): GOVERN,
    ("POST", "/v1/deployments/{deployment}/rollback"): GOVERN,
    ("PUT", "/v1/deployments/{name}/policy"): GOVERN,
    # request tags and serving
    ("POST", "/v1/requests"): INGEST,
    ("GET", "/v1/requests"): READ_AUDIT,
    ("GET", "/v1/requests/{request_id}"): READ_AUDIT,
    ("GET", "/v1/requests/{request_id}/bundle"): READ_AUDIT,
    ("POST", "/v1/telemetry/prometheus"): INGEST,
    ("GET", "/v1/exports/{engine}"): READ_REGISTRY,
    ("POST", "/v1/completions"): INGEST,
    ("POST", "/v1/chat/completions"): INGEST,
}

# Path parameter values used to reach each route; the handler may then answer 404/422,
# which still proves the role check let the caller through.
PATH_VALUES = {"engine": "vllm"}
DEFAULT_PATH_VALUE = "1"
