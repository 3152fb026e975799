"""The service layer: the only place with business rules.

Importing this package imports every service module so that ``OPERATIONS`` is complete.
"""

from registry.services import artifacts, audit_log, pairs, requests, tokens
from registry.services.base import OPERATIONS, operation

__all__ = ["OPERATIONS", "artifacts", "audit_log", "operation", "pairs", "requests", "tokens"]
