"""All ORM tables; importing this package registers every table on ``Base.metadata``."""

from registry.models.artifacts import Artifact, Lineage, Pair
from registry.models.audit import ApiToken, AuditEvent
from registry.models.base import Base, UTCDateTime, utcnow
from registry.models.governance import (
    Deployment,
    DeploymentEvent,
    DriftFlag,
    Job,
    Measurement,
    Policy,
    Validation,
    Worker,
)
from registry.models.requests import RequestBatch, RequestId, RequestTag, TelemetrySample

__all__ = [
    "ApiToken",
    "Artifact",
    "AuditEvent",
    "Base",
    "Deployment",
    "DeploymentEvent",
    "DriftFlag",
    "Job",
    "Lineage",
    "Measurement",
    "Pair",
    "Policy",
    "RequestBatch",
    "RequestId",
    "RequestTag",
    "TelemetrySample",
    "UTCDateTime",
    "Validation",
    "Worker",
    "utcnow",
]
