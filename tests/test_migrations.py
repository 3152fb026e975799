"""Migrations: up, down to base, up again on both dialects; ORM metadata matches the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from registry import db
from registry.errors import SchemaOutOfDate
from registry.models import Base


def _roundtrip(url: str) -> None:
    db.upgrade(url)
    assert db.current_revision(url) == db.head_revision()
    tables = set(inspect(db.get_engine(url)).get_table_names())
    assert {"artifacts", "pairs", "audit_events", "api_tokens", "lineages"} <= tables
    db.downgrade(url, "base")
    assert db.current_revision(url) is None
    leftover = set(inspect(db.get_engine(url)).get_table_names()) - {"alembic_version"}
    assert leftover == set()
    db.upgrade(url)
    assert db.current_revision(url) == db.head_revision()
    with db.get_engine(url).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"ORM metadata differs from migrated schema: {diff}"


def test_roundtrip_sqlite(tmp_path: Path) -> None:
    _roundtrip(f"sqlite:///{tmp_path / 'm.db'}")
    db.dispose_engines()


@pytest.mark.postgres
def test_roundtrip_postgres(pg_empty_url: str) -> None:
    _roundtrip(pg_empty_url)


def test_out_of_date_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with pytest.raises(SchemaOutOfDate, match="pairreg init"):
        db.require_current_schema(url)
    assert not (tmp_path / "old.db").exists(), "checking must not create the database file"
    db.upgrade(url, "0001")
    with pytest.raises(SchemaOutOfDate, match="revision 0001.*pairreg db upgrade"):
        db.require_current_schema(url)
    db.upgrade(url)
    db.require_current_schema(url)
    db.dispose_engines()


def test_sqlite_pragmas(sqlite_url: str) -> None:
    with db.get_engine(sqlite_url).connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
