"""Fixtures for the API tests: an initialised home, the app, and one token per role."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from registry.db import session_scope
from registry.governance.roles import ROLES
from registry.services.system import read_credentials
from registry.services.tokens import create_token, revoke_token
from registry.settings import Settings, reset_settings


@dataclass
class ApiEnv:
    """An initialised registry served in-process: the admin secret and one secret per role."""

    settings: Settings
    app: FastAPI
    client: TestClient
    admin: str
    tokens: dict[str, str]
    revoked: str

    def auth(self, role: str = "admin") -> dict[str, str]:
        secret = self.admin if role == "admin" else self.tokens[role]
        return {"Authorization": f"Bearer {secret}"}


def make_role_tokens(settings: Settings) -> tuple[dict[str, str], str]:
    """One live token per role (besides the initial admin) and one revoked token."""
    tokens: dict[str, str] = {}
    with session_scope(settings.db_url) as session:
        for role in ROLES:
            if role == "admin":
                continue
            tokens[role] = create_token(
                session, name=f"t-{role}", role=role, actor="test:setup"
            ).secret
        revoked = create_token(session, name="t-revoked", role="admin", actor="test:setup")
        revoke_token(session, name="t-revoked", actor="test:setup")
    return tokens, revoked.secret


@pytest.fixture
def api(home: Settings) -> Iterator[ApiEnv]:
    """The app over the ``home`` registry (SQLite and PostgreSQL), with a token per role."""
    from api.app import create_app

    creds = read_credentials(home.credentials_path)
    assert creds and creds["token"]
    tokens, revoked = make_role_tokens(home)
    app = create_app(home)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield ApiEnv(home, app, client, creds["token"], tokens, revoked)


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated PostgreSQL database (skips like ``db_url`` when no server is reachable)."""
    from tests.conftest import drop_pg_database, make_pg_database

    template: str = request.getfixturevalue("pg_template")
    url = make_pg_database(template)
    yield url
    drop_pg_database(url)


@pytest.fixture
def sqlite_home(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Settings]:
    """Like ``home`` but SQLite only, for tests that tamper with rows PostgreSQL protects."""
    from registry.services.system import initialise

    monkeypatch.setenv("PAIRREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PAIRREG_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("PAIRREG_URL", raising=False)
    monkeypatch.delenv("PAIRREG_TOKEN", raising=False)
    reset_settings()
    settings = Settings()
    initialise(settings)
    yield settings
    reset_settings()


@dataclass
class CliResult:
    exit_code: int
    output: str


def run_cli(*args: str) -> CliResult:
    """Run ``pairreg`` in-process with ``main()``'s exit codes (PairregError -> 2)."""
    from typer.testing import CliRunner

    from cli.main import app
    from registry.errors import PairregError

    reset_settings()
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, PairregError):
        return CliResult(2, result.output + str(result.exception))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.output)
