"""Failures of what the registry stands on (a full disk, an unreachable database), told
apart from bugs so that the API and the CLI can answer them clearly and clients can retry.

Both are the environment's fault, not the request's: the API answers 507 (disk full) or
503 (database unavailable) as problem+json with ``Retry-After``, never a bare 500; the CLI
prints one line and exits 1. Every write happens in one transaction, so a request that
failed this way stored nothing and can simply be sent again.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

# PostgreSQL: serialization_failure, deadlock_detected; the transaction was rolled back.
TRANSIENT_SQLSTATES = {"40001", "40P01"}
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_DISK_FULL_TEXT = ("disk is full", "no space left", "could not extend file", "disk full")


@dataclass(frozen=True)
class Outage:
    status: int
    kind: str
    title: str
    detail: str


class OutageError(Exception):
    """An outage already classified (in a write worker process, ``api/write_pool.py``),
    carried to the process that answers the client."""

    def __init__(self, outage: Outage) -> None:
        super().__init__(outage)
        self.outage = outage

    def __str__(self) -> str:
        return self.outage.detail


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _full(path: Path) -> bool:
    """True when the filesystem holding ``path`` (or its nearest existing parent) has no
    space left for an unprivileged writer."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize < 64 * 1024
    return False


def classify(exc: BaseException, where: Sequence[Path] = ()) -> Outage | None:
    """An :class:`Outage` when ``exc`` (or what caused it) is a full disk or a lost
    database; None for anything else, which stays a server error.

    SQLite reports a full disk as "database or disk is full" only when the database file
    cannot grow; when it cannot create its WAL or shared-memory file it says "disk I/O
    error". ``where`` (the data directory) lets such an error be named for what it is when
    that filesystem is in fact full."""
    for e in _chain(exc):
        if isinstance(e, OutageError):
            return e.outage
    for e in _chain(exc):
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            where = f" ({e.filename})" if e.filename else ""
            return Outage(507, "storage_full", "Insufficient storage", f"disk full{where}: {text}")
        if isinstance(e, DBAPIError) and any(t in text.lower() for t in _DISK_FULL_TEXT):
            return Outage(507, "storage_full", "Insufficient storage", f"database: {text}")
        if isinstance(e, DBAPIError) and "disk i/o error" in text.lower():
            full = [p for p in where if _full(Path(p))]
            if full:
                detail = f"disk full ({full[0]}): database: {text}"
                return Outage(507, "storage_full", "Insufficient storage", detail)
    for e in _chain(exc):
        if isinstance(e, OperationalError | InterfaceError) or (
            isinstance(e, DBAPIError) and e.connection_invalidated
        ):
            text = str(e.orig if isinstance(e, DBAPIError) else e).splitlines()[0]
            return Outage(503, "unavailable", "Database unavailable", f"database: {text}")
    return None


def is_transient(exc: BaseException) -> bool:
    """True when the whole transaction may simply run again: PostgreSQL chose it as a
    deadlock or serialization victim, the connection was lost before it committed (a
    stale pooled connection after a database restart), or SQLite stayed locked. The
    transaction was rolled back in each case, so a retry cannot write anything twice."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in TRANSIENT_SQLSTATES:
        return True
    return "database is locked" in str(orig)


def data_paths(settings: object) -> list[Path]:
    """Where the registry writes: the home, and the SQLite file's folder if elsewhere."""
    home = getattr(settings, "home_dir", None)
    paths = [home] if isinstance(home, Path) else []
    url = str(getattr(settings, "db_url", ""))
    if url.startswith("sqlite:///"):
        paths.append(Path(url.removeprefix("sqlite:///")).parent)
    return paths
