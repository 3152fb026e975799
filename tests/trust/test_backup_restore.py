"""Backup and restore drills: ``pg_dump`` → a fresh database, and SQLite's online backup;
the restored log verifies and is consistent with the last signed checkpoint, and a restore
of an older backup is caught against a later checkpoint."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from registry.db import get_engine, session_scope
from registry.services import transparency as tl
from registry.settings import Settings
from registry.trust import audit, audit_tree
from tests.conftest import drop_pg_database, make_pg_database


def _grow(url: str, n: int, start: int) -> None:
    with session_scope(url) as s:
        for i in range(start, start + n):
            audit.append_event(
                s,
                actor="drill",
                action="drill.event",
                entity_type="t",
                entity_id=i,
                payload={"i": i},
            )


def _check_restored(url: str, checkpoint: str, size: int) -> None:
    with session_scope(url) as s:
        audit.integrate(s)  # integrate before read
        assert audit_tree.verify_tree(s).ok
        verdict = tl.verify_audit_log(s, checkpoint=checkpoint)
    assert verdict.ok and verdict.checkpoint_ok, verdict
    assert verdict.tree_size == size and verdict.checkpoint_size == size


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_pg_dump_and_restore_drill(home: Settings, tmp_path: Path) -> None:
    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.skip("pg_dump/pg_restore are not installed")
    url = home.db_url
    _grow(url, 30, 0)
    with session_scope(url) as s:
        old = tl.sign_log_checkpoint(s, actor="drill")
    dump_old = tmp_path / "old.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump_old), _libpq(url)], check=True)
    _grow(url, 9, 100)
    with session_scope(url) as s:
        last = tl.sign_log_checkpoint(s, actor="drill")
    dump = tmp_path / "registry.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), _libpq(url)], check=True)

    for backup, expect in ((dump, "ok"), (dump_old, "truncated")):
        restored = make_pg_database()
        try:
            subprocess.run(
                ["pg_restore", "--no-owner", "-d", _libpq(restored), str(backup)], check=True
            )
            if expect == "ok":
                _check_restored(restored, last.note, last.tree_size)
                with session_scope(restored) as s:
                    assert tl.verify_audit_log(s, checkpoint=old.note).checkpoint_ok
                # The append-only triggers came back with the restore.
                with pytest.raises(DBAPIError, match="append-only"):
                    with get_engine(restored).begin() as conn:
                        conn.execute(text("DELETE FROM audit_tree"))
            else:
                # An older backup restored in place of the current database: the log is a
                # valid prefix, but the later checkpoint shows events are missing.
                with session_scope(restored) as s:
                    audit.integrate(s)  # integrate before read
                    assert audit_tree.verify_tree(s).ok
                    verdict = tl.verify_audit_log(s, checkpoint=last.note)
                assert not verdict.ok and verdict.checkpoint_ok is False
                assert "the log has only 31" in (verdict.checkpoint_detail or "")
        finally:
            drop_pg_database(restored)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sqlite_online_backup_drill(home: Settings, tmp_path: Path) -> None:
    url = home.db_url
    _grow(url, 25, 0)
    source = make_url(url).database
    assert source
    with session_scope(url) as s:
        cp = tl.sign_log_checkpoint(s, actor="drill")
        # Online: the backup runs while a writer holds the database open.
        copy = tmp_path / "backup.db"
        src = sqlite3.connect(source)
        dst = sqlite3.connect(copy)
        with dst:
            src.backup(dst)
        src.close()
        dst.close()
    restored = f"sqlite:///{copy}"
    _check_restored(restored, cp.note, cp.tree_size)
