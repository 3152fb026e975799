"""All ORM tables; importing this package registers every table on ``Base.metadata``."""

from registry.models.artifacts import Artifact, Lineage, Pair
from registry.models.audit import ApiToken, AuditEvent
from registry.models.base import Base, UTCDateTime, utcnow

__all__ = ["ApiToken", "Artifact", "AuditEvent", "Base", "Lineage", "Pair", "UTCDateTime", "utcnow"]
