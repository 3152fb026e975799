"""Shared fixtures: a fresh, migrated database per test on SQLite and PostgreSQL (the
threading defaults for torch are set in ``tests/__init__.py``, imported first).

Each dialect is migrated once into a template (a SQLite file, a PostgreSQL template
database); each test gets a copy, which is much faster than migrating per test and keeps
tests independent. PostgreSQL tests skip only when no server is reachable, and never in CI
(``CI=true`` or ``PAIRREG_REQUIRE_POSTGRES=1``), where a missing server is a failure.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from registry import db
from registry.settings import Settings, reset_settings
from tests.prepare import TEST_CACHE, tiny_pairs

PG_URL = os.environ.get(
    "PAIRREG_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REQUIRE_PG = os.environ.get("CI") == "true" or os.environ.get("PAIRREG_REQUIRE_POSTGRES") == "1"
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
REPO = Path(__file__).resolve().parents[1]


def _pg_admin_engine():  # type: ignore[no-untyped-def]
    return create_engine(PG_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)


def _pg_reachable() -> str | None:
    try:
        with _pg_admin_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return str(exc).splitlines()[0]


def _pg_url_for(dbname: str) -> str:
    return make_url(PG_URL).set(database=dbname).render_as_string(hide_password=False)


def _drop_pg_database(conn, name: str) -> None:  # type: ignore[no-untyped-def]
    conn.execute(
        text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = :n AND pid <> pg_backend_pid()"
        ),
        {"n": name},
    )
    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


@pytest.fixture(scope="session", autouse=True)
def artifact_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Let a test's own server read the models the tests write (under pytest's temp
    directory and the tiny-pair cache): a remote client is confined to the artifact roots,
    ``$PAIRREG_HOME/models`` by default. Servers started in subprocesses inherit it; tests
    of the confinement itself set their own roots."""
    roots = os.pathsep.join([str(tmp_path_factory.getbasetemp()), str(TEST_CACHE)])
    previous = os.environ.get("PAIRREG_ARTIFACT_ROOTS")
    os.environ["PAIRREG_ARTIFACT_ROOTS"] = roots
    reset_settings()
    yield roots
    if previous is None:
        os.environ.pop("PAIRREG_ARTIFACT_ROOTS", None)
    else:
        os.environ["PAIRREG_ARTIFACT_ROOTS"] = previous
    reset_settings()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    url = f"sqlite:///{path}"
    db.upgrade(url)
    db.dispose_engines()
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    reason = _pg_reachable()
    if reason is not None:
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL required but unreachable at {PG_URL}: {reason}")
        pytest.skip(f"no PostgreSQL server reachable at {PG_URL}: {reason}")
    name = f"pairreg_tmpl_{WORKER}_{uuid.uuid4().hex[:8]}"
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db.upgrade(_pg_url_for(name))
    db.dispose_engines()
    yield name
    with admin.connect() as conn:
        _drop_pg_database(conn, name)
    admin.dispose()


def make_pg_database(template: str | None = None) -> str:
    """A new empty (or template-copied) PostgreSQL database; returns its URL."""
    name = f"pairreg_t_{WORKER}_{uuid.uuid4().hex[:10]}"
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        suffix = f' TEMPLATE "{template}"' if template else ""
        conn.execute(text(f'CREATE DATABASE "{name}"{suffix}'))
    admin.dispose()
    return _pg_url_for(name)


def drop_pg_database(url: str) -> None:
    db.dispose_engines()
    admin = _pg_admin_engine()
    with admin.connect() as conn:
        _drop_pg_database(conn, make_url(url).database or "")
    admin.dispose()


@pytest.fixture
def pg_empty_url() -> Iterator[str]:
    """An empty PostgreSQL database (for migration tests)."""
    reason = _pg_reachable()
    if reason is not None:
        if REQUIRE_PG:
            pytest.fail(f"PostgreSQL required but unreachable at {PG_URL}: {reason}")
        pytest.skip(f"no PostgreSQL server reachable at {PG_URL}: {reason}")
    url = make_pg_database()
    yield url
    drop_pg_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated database at head, fresh for this test, on each dialect."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "registry.db"
        shutil.copyfile(template, path)
        url = f"sqlite:///{path}"
        yield url
        db.dispose_engines()
    else:
        template_name: str = request.getfixturevalue("pg_template")
        url = make_pg_database(template_name)
        yield url
        drop_pg_database(url)


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> Iterator[str]:
    """SQLite only, for tests that need no dialect coverage."""
    path = tmp_path / "registry.db"
    shutil.copyfile(sqlite_template, path)
    yield f"sqlite:///{path}"
    db.dispose_engines()


@pytest.fixture
def home(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """PAIRREG_HOME in a temp dir, the database from ``db_url``, initialised (admin token)."""
    from registry.services.system import initialise

    monkeypatch.setenv("PAIRREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PAIRREG_DATABASE_URL", db_url)
    monkeypatch.delenv("PAIRREG_URL", raising=False)
    monkeypatch.delenv("PAIRREG_TOKEN", raising=False)
    reset_settings()
    settings = Settings()
    initialise(settings)
    yield settings
    reset_settings()


@pytest.fixture(scope="session")
def tiny():  # type: ignore[no-untyped-def]
    """Paths of the tiny pairs (target-v1, target-v2, draft, medusa), built once."""
    return tiny_pairs()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A small fake model directory with a config and a byte-level tokenizer."""
    from tests.fixtures import write_fake_model

    return write_fake_model(tmp_path / "model")


# Fixtures whose assets take minutes to build on a new machine (``tests/prepare.py``).
PREPARED = ("tiny", "mlflow_server")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the run so nothing waits on a build it could have overlapped.

    Tests that need a prepared asset (the tiny pairs, the MLflow server's venv) come after
    the seven hundred that need neither: ``make test`` builds the assets in the background
    meanwhile (``tests/prepare.py``), so on a new machine the pytest workers keep testing
    instead of waiting at the build's lock. Real-pair tests run last when a run selects every
    tier (``make test`` leaves them out; ``make test-real`` runs them alone): the real pair
    builds in the background too, and the real tests wait on its lock if it is not done.
    Within the prepared group the ``slow`` flows go first, so the run does not end on one
    long test while the other worker idles. The sort is stable and the same in every xdist
    worker, as xdist requires."""

    def key(item: pytest.Item) -> tuple[bool, bool, bool]:
        prepared = any(name in item.fixturenames for name in PREPARED)  # type: ignore[attr-defined]
        quick = item.get_closest_marker("slow") is None
        return item.get_closest_marker("real") is not None, prepared, prepared and quick

    items.sort(key=key)
