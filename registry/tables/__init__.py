"""All ORM tables; importing this package registers every table on ``Base.metadata``."""

from registry.tables.artifacts import Artifact, Lineage, Pair
from registry.tables.audit import (
    ApiToken,
    AuditEvent,
    AuditLeaf,
    AuditPending,
    AuditTreeNode,
    LogCheckpoint,
    RetentionPolicy,
)
from registry.tables.base import Base, UTCDateTime, utcnow
from registry.tables.governance import (
    Deployment,
    DeploymentEvent,
    DriftFlag,
    Job,
    Measurement,
    Policy,
    RemoteCodeApproval,
    Validation,
    Worker,
    WorkerKey,
)
from registry.tables.online import OnlineBucket, OnlineMonitor
from registry.tables.requests import RequestBatch, RequestId, RequestTag, TelemetrySample
from registry.tables.webhooks import (
    AcceptanceCurveRow,
    MlflowDelivery,
    MlflowSource,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEvent,
    WebhookSubscription,
)

__all__ = [
    "AcceptanceCurveRow",
    "ApiToken",
    "Artifact",
    "AuditEvent",
    "AuditLeaf",
    "AuditPending",
    "AuditTreeNode",
    "Base",
    "Deployment",
    "DeploymentEvent",
    "DriftFlag",
    "Job",
    "Lineage",
    "LogCheckpoint",
    "Measurement",
    "MlflowDelivery",
    "MlflowSource",
    "OnlineBucket",
    "OnlineMonitor",
    "Pair",
    "Policy",
    "RemoteCodeApproval",
    "RequestBatch",
    "RequestId",
    "RequestTag",
    "RetentionPolicy",
    "TelemetrySample",
    "UTCDateTime",
    "Validation",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEvent",
    "WebhookSubscription",
    "Worker",
    "WorkerKey",
    "utcnow",
]
