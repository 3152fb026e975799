"""What every service shares: cursors and paging.

Services are plain functions ``fn(session, *, ..., actor=...)``. Which of them are operations
(and who may call them, where, with which errors) is declared once, in
``registry/contract/operations.py``: the one operation registry every edge follows.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session

from registry.errors import InvalidInput

MAX_PAGE = 500


def encode_cursor(value: int) -> str:
    return base64.urlsafe_b64encode(str(value).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    if not cursor:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return int(base64.urlsafe_b64decode(padded.encode()).decode())
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput("cursor is not one this service issued", field="cursor") from exc


def check_limit(limit: int) -> int:
    if limit < 1 or limit > MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}", field="limit")
    return limit


def page_query(
    session: Session, stmt: Select[Any], key_column: Any, cursor: str | None, limit: int
) -> tuple[list[Any], str | None]:
    """Keyset pagination on an ascending integer key: stable under concurrent inserts."""
    check_limit(limit)
    after = decode_cursor(cursor)
    if after is not None:
        stmt = stmt.where(key_column > after)
    rows = list(session.scalars(stmt.order_by(key_column).limit(limit + 1)).unique().all())
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        next_cursor = encode_cursor(int(getattr(rows[-1], key_column.key)))
    return rows, next_cursor
