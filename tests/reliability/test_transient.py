"""Concurrency faults found by the load test: promotion no longer waits on the locks that
ingest holds (it deadlocked with it), and a transaction the database rolled back on its own
(deadlock victim, lost connection) is run again by the route instead of surfacing."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from registry.db import get_engine, session_scope
from registry.outages import is_transient
from registry.refs import deployment_named
from registry.services import deployments


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
