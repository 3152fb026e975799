"""Engine, sessions and the schema-version guard.

SQLite is the embedded default, so its connections get WAL, foreign keys and a busy
timeout, and every transaction starts with ``BEGIN IMMEDIATE``: the registry's writers
read-then-write (next version number, audit chain head), and a deferred SQLite
transaction would fail such an upgrade instead of waiting for the lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from registry.errors import SchemaOutOfDate

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
_SESSIONMAKERS: dict[str, sessionmaker[Session]] = {}


def sqlite_file(url: str) -> Path | None:
    """The database file of a file-backed SQLite URL, else None."""
    if not is_sqlite(url):
        return None
    path = url.split("///", 1)[-1] if "///" in url else ""
    return Path(path) if path and path != ":memory:" else None


def get_engine(url: str) -> Engine:
    """One engine per URL for the life of the process."""
    if url in _ENGINES:
        return _ENGINES[url]
    if is_sqlite(url):
        path = sqlite_file(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})
        _install_sqlite_pragmas(engine)
    else:
        # At most 30 connections, as before; 20 are kept open rather than 10, so the API's
        # read and write lanes (16 + 4 threads by default, api/lanes.py) do not open and
        # close a connection per request once more than 10 are busy.
        engine = create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=10)
    _ENGINES[url] = engine
    return engine


def warm_pool(url: str, connections: int) -> int:
    """Open up to ``connections`` pooled connections now (a server about to take load),
    rather than while the first burst of requests waits for them. Returns how many."""
    engine = get_engine(url)
    if is_sqlite(url):
        return 0
    held = []
    try:
        for _ in range(min(connections, POOL_SIZE)):
            held.append(engine.connect())
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


def _sessionmaker(url: str) -> sessionmaker[Session]:
    if url not in _SESSIONMAKERS:
        _SESSIONMAKERS[url] = sessionmaker(bind=get_engine(url), expire_on_commit=False)
    return _SESSIONMAKERS[url]


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A transaction: commit on success, roll back on any error (no partial writes)."""
    session = _sessionmaker(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


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
