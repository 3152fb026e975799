"""The service layer: the only place with business rules.

Importing this package imports every service module so that ``OPERATIONS`` is complete.
"""

from registry.services import (
    artifacts,
    audit_log,
    bundles,
    curves,
    deployments,
    drift,
    duties,
    exports,
    job_results,
    jobs,
    measurements,
    mlflow_sources,
    online,
    pairs,
    policies,
    requests,
    retention,
    telemetry,
    tokens,
    transparency,
    validation,
    watch,
    webhooks,
)
from registry.services.base import OPERATIONS, operation

__all__ = [
    "OPERATIONS",
    "artifacts",
    "audit_log",
    "bundles",
    "curves",
    "deployments",
    "drift",
    "duties",
    "exports",
    "job_results",
    "jobs",
    "measurements",
    "mlflow_sources",
    "online",
    "operation",
    "pairs",
    "policies",
    "requests",
    "retention",
    "telemetry",
    "tokens",
    "transparency",
    "validation",
    "watch",
    "webhooks",
]
