"""``pairreg init`` and the schema guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from registry import db
from registry.settings import Settings
from tests.core.conftest import CliResult, audit_actions, counts


def test_init_creates_home_and_is_idempotent(
    tmp_path: Path,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    cli: Callable[..., CliResult],
) -> None:
    home = tmp_path / "fresh-home"
    monkeypatch.setenv("PAIRREG_HOME", str(home))
    monkeypatch.setenv("PAIRREG_DATABASE_URL", db_url)
    monkeypatch.delenv("PAIRREG_URL", raising=False)
    db.downgrade(db_url, "base")  # an empty database, as on a first install
    assert db.current_revision(db_url) is None

    first = cli("init", "--json")
    assert first.rc == 0, first.err
    report = first.json()
    assert report["upgraded"] is True and report["admin_token_created"] is True
    assert report["schema_revision"] == db.head_revision() == db.current_revision(db_url)
    creds = json.loads((home / "credentials").read_text())
    assert len(creds["token"]) >= 32
    assert (home / "credentials").stat().st_mode & 0o777 == 0o600
    assert (home / "audit-signing.key").is_file() and (home / "audit-signing.pub").is_file()
    events = audit_actions(db_url)
    assert events == ["token.created"]

    second = cli("init", "--json")
    assert second.rc == 0, second.err
    again = second.json()
    assert again["upgraded"] is False and again["admin_token_created"] is False
    assert json.loads((home / "credentials").read_text()) == creds, "no new admin token"
    assert audit_actions(db_url) == events, "no new audit events"

    current = cli("db", "current", "--json").json()
    assert current["current"] == current["head"] and current["up_to_date"] is True


def test_commands_refuse_out_of_date_schema(home: Settings, cli: Callable[..., CliResult]) -> None:
    db.downgrade(home.db_url, "base")
    for args in (("artifact", "list"), ("pair", "list", "--json")):
        res = cli(*args)
        assert res.rc == 2
        assert res.out == ""
        lines = res.err.strip().splitlines()
        assert len(lines) == 1 and "pairreg db upgrade" in lines[0], res.err
    up = cli("db", "upgrade", "--json")
    assert up.rc == 0 and up.json()["before"] is None
    assert up.json()["after"] == db.head_revision()
    ok = cli("artifact", "list", "--json")
    assert ok.rc == 0 and ok.json() == {"items": [], "next_cursor": None}
    assert counts(home.db_url)["artifacts"] == 0


def test_console_script_exit_code_on_old_schema(sqlite_url: str, tmp_path: Path) -> None:
    """The installed ``pairreg`` script itself: exit 2, one stderr line, no traceback."""
    db.downgrade(sqlite_url, "base")
    db.dispose_engines()
    env = {
        **os.environ,
        "PAIRREG_HOME": str(tmp_path / "h"),
        "PAIRREG_DATABASE_URL": sqlite_url,
        "COLUMNS": "300",
    }
    env.pop("PAIRREG_URL", None)
    script = Path(sys.executable).with_name("pairreg")
    proc = subprocess.run(
        [str(script), "artifact", "show", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "pairreg db upgrade" in proc.stderr
    assert "Traceback" not in proc.stderr
