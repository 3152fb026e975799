"""The audit log is append-only on both dialects, and the embedded database is private."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from registry import db
from registry.db import get_engine, session_scope
from registry.services import transparency as tl
from registry.services.tokens import create_token
from registry.settings import Settings

REFUSED = {
    "audit_events": (
        "UPDATE audit_events SET actor = 'local:mallory' WHERE seq = 1",
        "DELETE FROM audit_events WHERE seq = 2",
    ),
    "audit_tree": (
        "UPDATE audit_tree SET hash = hash WHERE level = 0 AND idx = 0",
        "DELETE FROM audit_tree WHERE level = 0",
    ),
    "log_checkpoints": (
        "UPDATE log_checkpoints SET signed_by = 'local:mallory'",
        "DELETE FROM log_checkpoints",
    ),
}


def test_audit_tables_refuse_update_and_delete(home: Settings) -> None:
    """The same guard on SQLite (revision 0010) as on PostgreSQL (0001, 0005)."""
    with session_scope(home.db_url) as s:
        create_token(s, name="a", role="reader", actor="local:alice")
        create_token(s, name="b", role="reader", actor="local:alice")
        tl.sign_log_checkpoint(s, actor="local:alice")
    engine = get_engine(home.db_url)
    with engine.connect() as conn:
        before = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() for t in REFUSED}
        actor = conn.execute(text("SELECT actor FROM audit_events WHERE seq = 1")).scalar()
        conn.rollback()
    assert all(before.values()), before
    for table, statements in REFUSED.items():
        for statement in statements:
            verb = statement.split()[0]
            with pytest.raises(DBAPIError, match=rf"{table} is append-only \({verb} refused\)"):
                with engine.begin() as conn:
                    conn.execute(text(statement))
    with engine.connect() as conn:
        after = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() for t in REFUSED}
        assert conn.execute(text("SELECT actor FROM audit_events WHERE seq = 1")).scalar() == actor
        conn.rollback()
    assert after == before
    # Appending still works.
    with session_scope(home.db_url) as s:
        create_token(s, name="c", role="reader", actor="local:alice")
    with session_scope(home.db_url) as s:
        assert tl.verify_audit_log(s).ok


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_embedded_database_files_are_private(tmp_path: Path) -> None:
    """registry.db and its WAL and shared-memory files are created 0600 whatever the umask
    allows, and a database made before (0644) is tightened when opened."""
    path = tmp_path / "home" / "registry.db"
    url = f"sqlite:///{path}"
    db.upgrade(url)
    with session_scope(url) as s:
        create_token(s, name="a", role="reader", actor="local:alice")
        # While a connection is open the WAL and shared-memory files exist.
        companions = [path.with_name(path.name + sfx) for sfx in ("-wal", "-shm")]
        assert all(p.exists() for p in companions)
        assert {_mode(p) for p in (path, *companions)} == {0o600}
    db.dispose_engines()

    old = tmp_path / "old.db"
    old.write_bytes(path.read_bytes())
    old.chmod(0o644)
    db.get_engine(f"sqlite:///{old}")
    assert _mode(old) == 0o600
    db.dispose_engines()
