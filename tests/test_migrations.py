"""Migrations: up, down to base, up again on both dialects; ORM metadata matches the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from registry import db
from registry.errors import SchemaOutOfDate
from registry.tables import Base


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


def _old_chain_events(url: str, n: int) -> list[str]:
    """Events as revision 0008 wrote them: chained, with their tree leaves."""
    import hashlib
    import json
    from datetime import UTC, datetime

    from sqlalchemy import text

    from registry.canonical import canonical_json
    from registry.trust import audit_tree

    prev, hashes = "0" * 64, []
    with db.get_engine(url).begin() as conn:
        for seq in range(1, n + 1):
            at = datetime(2026, 1, 1, 0, 0, seq, tzinfo=UTC)
            body = {
                "seq": seq,
                "occurred_at": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "actor": "local:alice",
                "action": "test.event",
                "entity_type": "test",
                "entity_id": str(seq),
                "payload": {"i": seq},
            }
            h = hashlib.sha256(bytes.fromhex(prev) + canonical_json(body)).hexdigest()
            conn.execute(
                text(
                    "INSERT INTO audit_events (seq, occurred_at, actor, action, entity_type, "
                    "entity_id, payload, prev_hash, chain_hash) VALUES (:seq, :at, "
                    "'local:alice', 'test.event', 'test', :eid, :p, :prev, :h)"
                ),
                {
                    "seq": seq,
                    "at": at,
                    "eid": str(seq),
                    "p": json.dumps({"i": seq}),
                    "prev": prev,
                    "h": h,
                },  # fmt: skip
            )
            audit_tree.append_leaf(conn, seq - 1, body)
            prev = h
            hashes.append(h)
    return hashes


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_chain_retired_only_after_the_events_verify(db_url: str) -> None:
    """Revision 0010 keeps every event, checks chain and tree first, and refuses (leaving
    the chain in place) when an event was altered."""
    from sqlalchemy import text

    from registry.trust import audit_tree

    db.downgrade(db_url, "0009")
    _old_chain_events(db_url, 9)
    with db.get_engine(db_url).connect() as conn:
        root = audit_tree.root(conn, 9)
        conn.rollback()
    db.upgrade(db_url)
    engine = db.get_engine(db_url)
    with engine.connect() as conn:
        cols = {c["name"] for c in inspect(conn).get_columns("audit_events")}
        assert "chain_hash" not in cols and "prev_hash" not in cols
        report = audit_tree.verify_tree(conn)
        conn.rollback()
    assert report.ok and report.size == 9 and report.root == root

    # Down again (the chain is recomputed), alter an event, and the upgrade refuses.
    db.downgrade(db_url, "0009")
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT chain_hash FROM audit_events ORDER BY seq")).scalars()
        assert list(stored) == _expected_chain(conn)
        conn.rollback()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text("UPDATE audit_events SET actor = 'local:mallory' WHERE seq = 4"))
    with pytest.raises(RuntimeError, match="audit chain broken at sequence 4"):
        db.upgrade(db_url)
    db.dispose_engines()
    assert db.current_revision(db_url) == "0009"


def _expected_chain(conn) -> list[str]:  # type: ignore[no-untyped-def]
    """The chain recomputed from the events by the migration's own helpers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "m0010", db.MIGRATIONS_DIR / "versions" / "0010_one_audit_log.py"
    )
    assert spec and spec.loader
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    prev, out = m.GENESIS_HASH, []
    for _row, body in m._chain_rows(conn, with_hashes=False):
        prev = m._step(prev, body)
        out.append(prev)
    return out
