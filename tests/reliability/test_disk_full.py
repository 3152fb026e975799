"""The home's disk full during a registration, a measurement and a checkpoint.

``PAIRREG_HOME`` (SQLite database, verified-model cache, keys) lives on a small tmpfs the
test mounts; before each operation a filler file takes every free byte. Each operation must
fail with one clear line (exit 1, no traceback), store nothing, and leave the SQLite
database and the audit log intact; with the space freed, the same command succeeds.

Mounting needs root (CAP_SYS_ADMIN); elsewhere the test is skipped, and the same outcome is
covered by ``test_outage_classification``, which feeds the error classifier the exact errors
a full disk raises (ENOSPC from a write, SQLite's "database or disk is full").
"""

from __future__ import annotations

import errno
import gc
import os
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from registry import db
from registry.db import session_scope
from registry.outages import classify
from registry.settings import reset_settings
from registry.tables import Artifact, AuditEvent, Measurement, Pair
from registry.trust.audit_tree import verify_tree
from tests.fixtures import write_fake_model

FS_BYTES = 32 * 1024 * 1024


def _mount_tmpfs(where: Path) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES},mode=0755", "tmpfs", str(where)],
        capture_output=True,
    )
    return done.returncode == 0


@pytest.fixture
def small_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    home = tmp_path / f"home-{uuid.uuid4().hex[:6]}"
    if not _mount_tmpfs(home):
        pytest.skip("cannot mount a tmpfs here (needs root); see test_outage_classification")
    url = f"sqlite:///{home / 'registry.db'}"
    monkeypatch.setenv("PAIRREG_HOME", str(home))
    monkeypatch.delenv("PAIRREG_DATABASE_URL", raising=False)
    monkeypatch.delenv("PAIRREG_URL", raising=False)
    monkeypatch.delenv("PAIRREG_TOKEN", raising=False)
    monkeypatch.setenv("PAIRREG_MLFLOW", "0")
    reset_settings()
    try:
        yield home, url
    finally:
        db.dispose_engines()
        reset_settings()
        subprocess.run(["umount", "-l", str(home)], capture_output=True)


class Filler:
    """Takes every free byte of the filesystem at ``home`` until released."""

    def __init__(self, home: Path):
        self.path = home / "filler.bin"

    def fill(self) -> None:
        # Close every pooled connection: SQLite then checkpoints and removes its WAL, so
        # the next write needs new blocks rather than reusing a WAL file's old ones.
        # Connections left to the garbage collector close (and free their files' blocks) too.
        db.dispose_engines()
        gc.collect()
        block = b"\0" * (1024 * 1024)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Until a pass finds nothing more: blocks a closing file gives back a moment after
            # the first pass (seen once under load as a checkpoint that fitted) are taken too.
            for _ in range(20):
                written = 0
                for size in (len(block), 4096, 1):
                    try:
                        while True:
                            written += os.write(fd, block[:size])
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                if not written:
                    break
                time.sleep(0.05)
        finally:
            os.close(fd)
        st = os.statvfs(self.path.parent)
        assert st.f_bavail == 0

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def _counts(url: str) -> dict[str, int]:
    with session_scope(url) as s:
        return {
            m.__tablename__: int(s.scalar(select(func.count()).select_from(m)) or 0)
            for m in (Artifact, Pair, Measurement, AuditEvent)
        }


def _intact(url: str) -> None:
    path = url.removeprefix("sqlite:///")
    db.dispose_engines()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with session_scope(url) as s:
        report = verify_tree(s)
    assert report.ok, report


def _clear_failure(r: Any) -> None:
    assert r.rc == 1, (r.rc, r.out, r.err)
    lines = [ln for ln in r.err.strip().splitlines() if ln.strip()]
    # one error line, the last thing printed (a progress display may precede it)
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert errors == lines[-1:], r.err
    assert errors[0].startswith("error: insufficient storage: "), errors[0]
    assert "Traceback" not in r.err + r.out


def _register(cli: Any, target: Path, draft: Path) -> tuple[tuple[str, ...], str]:
    add_target = ("artifact", "add", str(target), "--name", "acme/target", "--role", "target",
                  "--json")  # fmt: skip
    assert cli(*add_target).rc == 0
    r = cli("artifact", "add", str(draft), "--name", "acme/draft", "--role", "draft", "--json")
    assert r.rc == 0, r.err
    r = cli("pair", "register", "--target", "acme/target@v1", "--draft", "acme/draft@v1",
            "--method", "draft_model", "--k", "4", "--json")  # fmt: skip
    assert r.rc == 0, r.err
    return add_target, r.json()["pair"]["pair_digest"]


def test_disk_full_registration_and_checkpoint(small_home, cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    home, url = small_home
    assert cli("init").rc == 0
    filler = Filler(home)
    target = write_fake_model(tmp_path / "target", weights=b"t" * 200_000)
    draft = write_fake_model(tmp_path / "draft", weights=b"d" * 100_000, hidden_size=32)
    add_target = ("artifact", "add", str(target), "--name", "acme/target", "--role", "target",
                  "--json")  # fmt: skip

    # -- a registration ------------------------------------------------------------------
    before = _counts(url)
    filler.fill()
    _clear_failure(cli(*add_target))
    filler.release()
    assert _counts(url) == before  # no partial records
    _intact(url)
    _register(cli, target, draft)  # space back: the same commands succeed

    # -- a checkpoint (a signed C2SP note, recorded in the database and written out) ------
    note = home / "checkpoint.note"
    before = _counts(url)
    filler.fill()
    _clear_failure(cli("audit", "checkpoint", "-o", str(note)))
    filler.release()
    assert _counts(url) == before
    _intact(url)
    ok = cli("audit", "checkpoint", "-o", str(note))
    assert ok.rc == 0, ok.err
    assert note.read_text().count("\n") >= 3
    assert cli("audit", "verify").rc == 0


@pytest.mark.slow
def test_disk_full_measurement(small_home, cli, tiny) -> None:  # type: ignore[no-untyped-def]
    """``pairreg measure`` on the tiny pair: materialising the verified models into the home
    and storing the result both need space."""
    home, url = small_home
    assert cli("init").rc == 0
    filler = Filler(home)
    _, digest = _register(cli, Path(tiny.target_v1), Path(tiny.draft))
    measure = ("measure", digest, "--per-category", "1", "--max-new-tokens", "8",
               "--device", "cpu", "--json")  # fmt: skip

    # the first run on a full disk cannot even copy the verified models into the home
    before = _counts(url)
    filler.fill()
    _clear_failure(cli(*measure))
    filler.release()
    assert _counts(url) == before
    _intact(url)
    # with space it runs (and fills the verified-model cache) ...
    first = cli(*measure)
    assert first.rc == 0, first.err
    # ... and a second run on a full disk computes, then cannot store its result
    before = _counts(url)
    filler.fill()
    _clear_failure(cli(*measure))
    filler.release()
    assert _counts(url) == before
    _intact(url)
    again = cli(*measure)
    assert again.rc == 0, again.err
    assert _counts(url)["measurements"] == before["measurements"] + 1


def test_outage_classification() -> None:
    """What a full disk and a lost database raise is named, not left a server error."""
    full = OSError(errno.ENOSPC, "No space left on device", "/home/x/registry.db")
    outage = classify(full)
    assert outage is not None and outage.status == 507 and "registry.db" in outage.detail
    sqlite_full = OperationalError(
        "INSERT …", {}, sqlite3.OperationalError("database or disk is full")
    )
    assert classify(sqlite_full) is not None and classify(sqlite_full).status == 507  # type: ignore[union-attr]
    lost = OperationalError("SELECT 1", {}, Exception("connection refused"))
    assert classify(lost) is not None and classify(lost).status == 503  # type: ignore[union-attr]
    wrapped = RuntimeError("while storing")
    wrapped.__cause__ = full
    assert classify(wrapped) is not None and classify(wrapped).status == 507  # type: ignore[union-attr]
    io = OperationalError("INSERT …", {}, sqlite3.OperationalError("disk I/O error"))
    assert classify(io, where=[Path("/")]).status == 503  # type: ignore[union-attr]  # space left
    assert classify(ValueError("a bug")) is None
    assert classify(OSError(errno.EACCES, "Permission denied")) is None
