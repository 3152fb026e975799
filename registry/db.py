"""Engine, sessions and the schema-version guard.

SQLite is the embedded default, so its connections get WAL, foreign keys and a busy
timeout, and every transaction starts with ``BEGIN IMMEDIATE``: the registry's writers
read-then-write (next version number, audit sequence head), and a deferred SQLite
transaction would fail such an upgrade instead of waiting for the lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from registry.errors import SchemaOutOfDate
from registry.outages import is_transient

logger = logging.getLogger("pairreg.db")
T = TypeVar("T")
# Runs of one transaction: the first and up to this many more after a transient failure.
TRANSIENT_RETRIES = 3

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _install_sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")


_ENGINES: dict[str, Engine] = {}
POOL_SIZE = 20  # connections a server-database engine keeps open (plus 10 overflow)
_pool_size = POOL_SIZE


def set_pool_size(size: int) -> None:
    """Connections this process's server-database engines keep (a write worker process runs
    one transaction at a time and needs far fewer than the API's lanes). Before first use."""
    global _pool_size
    _pool_size = size


_SESSIONMAKERS: dict[str, sessionmaker[Session]] = {}


def sqlite_file(url: str) -> Path | None:
    """The database file of a file-backed SQLite URL, else None."""
    if not is_sqlite(url):
        return None
    path = url.split("///", 1)[-1] if "///" in url else ""
    return Path(path) if path and path != ":memory:" else None


PRIVATE_FILE_MODE = 0o600


def make_private(path: Path) -> None:
    """Create the SQLite database file owner-only (0600) before SQLite opens it, and tighten
    an existing one and its ``-wal`` / ``-shm`` companions.

    The database holds token hashes, the audit log and every record; SQLite would create it
    0644 (the umask's default), readable by every local account. SQLite creates the WAL and
    shared-memory files with the database file's own mode, so a private database file gives
    private companions; those already present are tightened too (a database made before)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.touch(mode=PRIVATE_FILE_MODE)
    for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if each.exists() and each.stat().st_mode & 0o077:
                each.chmod(PRIVATE_FILE_MODE)
        except OSError as exc:  # not ours to change: say so, do not refuse to serve
            logger.warning("could not make %s private (mode 0600): %s", each, exc)


def get_engine(url: str) -> Engine:
    """One engine per URL for the life of the process."""
    if url in _ENGINES:
        return _ENGINES[url]
    if is_sqlite(url):
        path = sqlite_file(url)
        if path is not None:
            make_private(path)
        engine = create_engine(url, connect_args={"timeout": 30})
        _install_sqlite_pragmas(engine)
    else:
        # At most 30 connections, as before; 20 are kept open rather than 10, so the API's
        # read and write lanes (8 + 4 threads by default, api/lanes.py) do not open and
        # close a connection per request once more than 10 are busy. No ping before each
        # use (a round trip per transaction): a connection that died with the database is
        # found at its first statement, the pool renewed and the transaction run again
        # (transact() below, the API's operations). Last in, first out: under light load
        # the same few connections serve, their prepared statements and catalog caches warm.
        engine = create_engine(
            url, pool_size=_pool_size, max_overflow=min(10, _pool_size), pool_use_lifo=True
        )
    _ENGINES[url] = engine
    return engine


def warm_pool(url: str, connections: int) -> int:
    """Open up to ``connections`` pooled connections now (a server about to take load),
    rather than while the first burst of requests waits for them, and have each one plan a
    query on every table: a new PostgreSQL backend reads the catalog entries of each table
    and index on its first query (measured 5-10 ms more for a request's audit on a fresh
    connection), which would otherwise land on the first requests. Returns how many."""
    from registry.tables import Base

    engine = get_engine(url)
    if is_sqlite(url):
        return 0
    touch = [text(f'SELECT * FROM "{t.name}" LIMIT 0') for t in Base.metadata.sorted_tables]
    held = []
    try:
        for _ in range(min(connections, _pool_size)):
            conn = engine.connect()
            held.append(conn)
            for stmt in touch:
                conn.execute(stmt)
            conn.rollback()
    finally:
        for conn in held:
            conn.close()
    return len(held)


def dispose_engines() -> None:
    """Close every pooled connection (tests drop databases; forks must not share sockets)."""
    for engine in _ENGINES.values():
        engine.dispose()
    _ENGINES.clear()
    _SESSIONMAKERS.clear()


def _sessionmaker(url: str, read_only: bool = False) -> sessionmaker[Session]:
    key = ("ro:" if read_only else "") + url
    if key not in _SESSIONMAKERS:
        engine = get_engine(url)
        if read_only:
            engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        _SESSIONMAKERS[key] = sessionmaker(bind=engine, expire_on_commit=False)
    return _SESSIONMAKERS[key]


@contextmanager
def session_scope(url: str, *, read_only: bool = False) -> Iterator[Session]:
    """A transaction: commit on success, roll back on any error (no partial writes).

    ``read_only`` (a server database): each statement runs on its own, without ``BEGIN``
    and ``COMMIT`` (two round trips of a read's three or four). Under PostgreSQL's READ
    COMMITTED every statement of a transaction takes a fresh snapshot anyway, so reads see
    exactly what they would have seen in one; a read that writes a single row (a token's
    last use) commits that statement alone. SQLite keeps its transactions."""
    session = _sessionmaker(url, read_only=read_only and not is_sqlite(url))()
    try:
        yield session
        session.commit()
    except BaseException as exc:
        session.rollback()
        event = getattr(exc, "audit_event", None)
        if event and not read_only:
            _audit_refusal(url, event)
        raise
    finally:
        session.close()


def _audit_refusal(url: str, event: dict[str, Any]) -> None:
    """Record a refusal (see ``registry.errors.Forbidden``) after its transaction rolled
    back; a failure here is logged and never hides the refusal itself."""
    from registry.trust.audit import append_event

    try:
        with session_scope(url) as session:
            append_event(session, **event)
    except Exception:  # noqa: BLE001 - the caller still gets its 403
        logger.exception("could not audit a refusal: %s", event.get("action"))


def transact(
    url: str,
    fn: Callable[[Session], T],
    *,
    read_only: bool = False,
    retries: int = TRANSIENT_RETRIES,
    what: str = "transaction",
) -> T:
    """``fn`` in :func:`session_scope`, run again (up to ``retries`` times) when the
    database rolled it back on its own: a deadlock or serialization victim, or a connection
    found dead (a database restart; pooled connections are not pinged before use, so the
    first use after a restart fails here and the pool is renewed). The transaction was
    rolled back each time, so nothing is written twice."""
    for attempt in range(retries + 1):
        try:
            with session_scope(url, read_only=read_only) as session:
                return fn(session)
        except DBAPIError as exc:
            if attempt == retries or not is_transient(exc):
                raise
            logger.info("%s: transient database error, retrying: %s", what, exc.orig)
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(url: str) -> str | None:
    with get_engine(url).connect() as conn:
        rev = MigrationContext.configure(conn).get_current_revision()
        conn.rollback()
        return rev


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def require_current_schema(url: str) -> None:
    """Refuse to work on a database whose schema is not at the code's head revision."""
    sqlite_path = sqlite_file(url)
    if sqlite_path is not None and not sqlite_path.exists():
        # Connecting would create an empty file and leave it behind.
        raise SchemaOutOfDate(f"no registry database at {sqlite_path}: run `pairreg init`")
    current = current_revision(url)
    head = head_revision()
    if current != head:
        where = "an empty database" if current is None else f"revision {current}"
        raise SchemaOutOfDate(
            f"database schema is {where}, code expects {head}: "
            "run `pairreg db upgrade` (or `pairreg init`)"
        )
