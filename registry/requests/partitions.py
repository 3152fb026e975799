"""Monthly partitions of ``request_tags`` on PostgreSQL (SQLite has one plain table).

Partitions live in their own schema, ``request_tag_partitions``, so the application schema
lists one table, ``request_tags``, exactly as the ORM declares it (Alembic's comparison of
models and database stays clean) and an operator can see the partitions at a glance.

A ``DEFAULT`` partition catches rows for months nobody created yet, so ingest never fails
for a date; :func:`ensure_month` moves such rows out when their month's partition is
created later (``pairreg requests partitions``, run monthly or from cron).
"""

from __future__ import annotations

from datetime import UTC, date, datetime

from sqlalchemy import text
from sqlalchemy.engine import Connection

SCHEMA = "request_tag_partitions"
PARENT = "request_tags"
DEFAULT = f"{SCHEMA}.{PARENT}_default"


def month_start(value: date | datetime) -> date:
    return date(value.year, value.month, 1)


def add_months(value: date, months: int) -> date:
    index = value.year * 12 + (value.month - 1) + months
    return date(index // 12, index % 12 + 1, 1)


def partition_name(month: date) -> str:
    return f"{PARENT}_y{month.year:04d}m{month.month:02d}"


def _bound(month: date) -> str:
    return f"{month.isoformat()} 00:00:00+00"


def existing_partitions(conn: Connection) -> list[str]:
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent "
            "JOIN pg_namespace pn ON pn.oid = p.relnamespace "
            "WHERE p.relname = :parent AND pn.nspname = current_schema() "
            "ORDER BY c.relname"
        ),
        {"parent": PARENT},
    )
    return [r[0] for r in rows]


def create_schema_and_default(conn: Connection) -> None:
    conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    conn.execute(text(f"CREATE TABLE IF NOT EXISTS {DEFAULT} PARTITION OF {PARENT} DEFAULT"))


def ensure_month(conn: Connection, month: date) -> bool:
    """Create one month's partition, moving any rows the default partition holds for it.

    Returns False when it already existed. Runs inside the caller's transaction, so a crash
    half-way leaves the rows where they were.
    """
    month = month_start(month)
    name = partition_name(month)
    if name in existing_partitions(conn):
        return False
    lo, hi = _bound(month), _bound(add_months(month, 1))
    qualified = f"{SCHEMA}.{name}"
    conn.execute(
        text(f"CREATE TABLE {qualified} (LIKE {PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    )
    conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {DEFAULT} WHERE served_at >= :lo AND served_at < :hi "
            f"RETURNING *) INSERT INTO {qualified} SELECT * FROM moved"
        ),
        {"lo": lo, "hi": hi},
    )
    conn.execute(
        text(
            f"ALTER TABLE {PARENT} ATTACH PARTITION {qualified} "
            f"FOR VALUES FROM ('{lo}') TO ('{hi}')"
        )
    )
    return True


def ensure_months(
    conn: Connection, *, before: int = 1, ahead: int = 3, now: datetime | None = None
) -> list[str]:
    """Partitions from ``before`` months ago to ``ahead`` months ahead; names created."""
    here = month_start(now or datetime.now(UTC))
    created = []
    for offset in range(-before, ahead + 1):
        month = add_months(here, offset)
        if ensure_month(conn, month):
            created.append(partition_name(month))
    return created


def default_partition_rows(conn: Connection) -> int:
    return int(conn.execute(text(f"SELECT count(*) FROM {DEFAULT}")).scalar() or 0)
