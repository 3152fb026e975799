"""Errors a client can cause, each with a kind the edges map to an exit code or HTTP status.

Services raise these and nothing else for bad input, so the API never answers 500 and the
CLI never prints a traceback for something the user can fix.
"""

from __future__ import annotations


class PairregError(Exception):
    """Base class: ``kind`` decides the HTTP status, ``field`` names the offending input."""

    kind = "invalid"
    status = 422
    title = "Invalid input"

    def __init__(self, message: str, *, field: str | None = None, details: object = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

    def __str__(self) -> str:
        return self.message


class InvalidInput(PairregError):
    kind = "invalid"
    status = 422
    title = "Invalid input"


class NotFound(PairregError):
    kind = "not_found"
    status = 404
    title = "Not found"


class Conflict(PairregError):
    kind = "conflict"
    status = 409
    title = "Conflict"


class Unauthorized(PairregError):
    kind = "unauthorized"
    status = 401
    title = "Unauthorized"


class Forbidden(PairregError):
    kind = "forbidden"
    status = 403
    title = "Forbidden"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        details: object = None,
        audit_event: dict[str, object] | None = None,
    ):
        super().__init__(message, field=field, details=details)
        # A refusal by a rule of separation of duties is itself audited: the refused
        # transaction rolls back, then ``registry.db.session_scope`` appends this event
        # (``append_event`` keyword arguments) in a transaction of its own.
        self.audit_event = audit_event


class SchemaOutOfDate(PairregError):
    kind = "schema"
    status = 503
    title = "Database schema out of date"


ERROR_KINDS: dict[str, type[PairregError]] = {
    cls.kind: cls
    for cls in (InvalidInput, NotFound, Conflict, Unauthorized, Forbidden, SchemaOutOfDate)
}
