"""Concurrency faults found by the load test: promotion no longer waits on the locks that
ingest holds (it deadlocked with it), and a transaction the database rolled back on its own
(deadlock victim, lost connection) is run again by the route instead of surfacing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError, ProgrammingError

from registry import db
from registry.db import get_engine, session_scope
from registry.outages import is_transient
from registry.refs import deployment_named
from registry.services import deployments
from registry.services.system import read_credentials


class _Orig(Exception):
    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


def _err(message: str, sqlstate: str | None = None, invalidated: bool = False) -> Any:
    return OperationalError(
        "stmt", {}, _Orig(message, sqlstate), connection_invalidated=invalidated
    )


def test_transient_errors_are_told_apart() -> None:
    assert is_transient(_err("deadlock detected", "40P01"))
    assert is_transient(_err("could not serialize access", "40001"))
    assert is_transient(_err("server closed the connection unexpectedly", invalidated=True))
    assert is_transient(_err("database is locked"))
    assert not is_transient(_err("relation does not exist", "42P01"))
    assert not is_transient(_err("database or disk is full"))
    assert not is_transient(ValueError("deadlock detected"))


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_promotion_lock_does_not_wait_on_ingest_key_share(db_url: str) -> None:
    """Inserting a request tag takes FOR KEY SHARE on its deployment row (the foreign key).
    Promotion's lock on that row must not wait for it: with FOR UPDATE it did, while the
    insert waited on the registry write lock promotion holds."""
    with session_scope(db_url) as s:
        deployments.create_deployment(s, name="prod", actor="test")
    engine = get_engine(db_url)
    with engine.connect() as ingest:
        tx = ingest.begin()
        ingest.execute(text("SELECT id FROM deployments WHERE name = 'prod' FOR KEY SHARE"))
        try:
            with session_scope(db_url) as s:
                s.execute(text("SET LOCAL lock_timeout = '2s'"))
                dep = deployment_named(s, "prod", lock=True)  # would time out if it waited
                assert dep is not None and dep.name == "prod"
        finally:
            tx.rollback()


@pytest.fixture
def app_client(sqlite_home: Any) -> Iterator[tuple[TestClient, dict[str, str]]]:
    from api.app import create_app

    creds = read_credentials(sqlite_home.credentials_path)
    assert creds is not None
    with TestClient(create_app(sqlite_home), raise_server_exceptions=False) as client:
        yield client, {"Authorization": f"Bearer {creds['token']}"}


def _flaky(monkeypatch: pytest.MonkeyPatch, failures: list[Exception]) -> list[int]:
    """Make the transactions (``registry.db.transact``) raise ``failures`` in turn before
    working again. Callers have made one request first, so the token check is remembered
    (api/auth.py) and only the route's own transactions count here."""
    calls: list[int] = []
    real = db.session_scope

    @contextmanager
    def scope(url: str, *, read_only: bool = False) -> Iterator[Any]:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        with real(url, read_only=read_only) as session:
            yield session

    monkeypatch.setattr(db, "session_scope", scope)
    return calls


def test_route_reruns_a_rolled_back_transaction(
    app_client: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, auth = app_client
    assert client.get("/v1/whoami", headers=auth).status_code == 200  # token remembered
    calls = _flaky(monkeypatch, [_err("deadlock detected", "40P01"), _err("x", invalidated=True)])
    resp = client.get("/v1/pairs", headers=auth)
    assert resp.status_code == 200, resp.text
    assert len(calls) == 3  # two rolled-back runs, then the one that answered


def test_outage_is_a_503_problem_not_a_500(
    app_client: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, auth = app_client
    assert client.get("/v1/whoami", headers=auth).status_code == 200  # token remembered
    down = _err("connection refused", invalidated=True)
    calls = _flaky(monkeypatch, [down] * 10)
    resp = client.get("/v1/pairs", headers=auth)
    assert len(calls) == db.TRANSIENT_RETRIES + 1  # bounded
    assert resp.status_code == 503, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.headers["retry-after"] == "1"
    assert resp.json()["kind"] == "unavailable"
    full = _err("database or disk is full")
    _flaky(monkeypatch, [full])
    resp = client.get("/v1/pairs", headers=auth)
    assert resp.status_code == 507 and resp.json()["kind"] == "storage_full"
    bug = ProgrammingError("stmt", {}, _Orig("syntax error", "42601"))
    _flaky(monkeypatch, [bug])  # a bug stays a 500
    assert client.get("/v1/pairs", headers=auth).status_code == 500
