"""Input types that many operations share, with their constraints declared once.

Service signatures use them (``cursor: Cursor = None, limit: Limit = 100``), and the
operation contract turns those signatures into the HTTP parameters and into the checks the
embedded backend applies, so a page size or a timestamp is validated the same way in both
modes and documented the same way in the OpenAPI schema.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, Field

MAX_LIMIT = 500

_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]")


def iso_text_only(value: object) -> object:
    """Refuse numbers as times (pydantic's lax mode would read ``0.5`` as a Unix time)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError("expected an ISO-8601 date-time with a timezone, e.g. 2025-01-31T12:00Z")
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError("expected an ISO-8601 date-time with a timezone, e.g. 2025-01-31T12:00Z")
    return value


def utc_representable(value: datetime) -> datetime:
    """Refuse an aware time that has no UTC form (``0001-01-01T00:00+00:01`` falls in year 0
    once converted): the database stores UTC, and the conversion would overflow there."""
    try:
        value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("date-time is out of range once converted to UTC") from exc
    return value


Cursor = Annotated[
    str | None,
    Field(
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="`next_cursor` from the previous page; omit for the first page.",
    ),
]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description="Page size.")]
Timestamp = Annotated[
    AwareDatetime,
    BeforeValidator(iso_text_only),
    AfterValidator(utc_representable),
    Field(description="ISO-8601 date-time with a timezone, e.g. 2025-01-31T12:00:00Z."),
]
Reason = Annotated[str, Field(min_length=1, max_length=2000, description="Why (recorded).")]
WorkerName = Annotated[str, Field(min_length=1, max_length=200, description="Worker name.")]
LeaseSeconds = Annotated[int, Field(ge=1, le=3600, description="Lease length in seconds.")]
Id = Annotated[int, Field(ge=1, le=2**62)]
# Request-tag pages are keyed on (served_at, request_id), so their cursors are longer.
RequestCursor = Annotated[
    str | None,
    Field(
        max_length=600,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="`next_cursor` from the previous page; omit for the first page.",
    ),
]
DeploymentName = Annotated[str, Field(min_length=1, max_length=100)]
PolicyName = Annotated[str, Field(min_length=1, max_length=100)]
ExpectVersion = Annotated[
    int | None, Field(ge=0, le=2**31, description="Refuse if the deployment moved past it.")
]
