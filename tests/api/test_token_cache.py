"""Who a token is, remembered for ``PAIRREG_TOKEN_CACHE_SECONDS`` (api/auth.py): no database
look-up per request, yet a revocation through this server counts from the next request, and
one made elsewhere within the cache's seconds."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from sqlalchemy import event

from api.app import create_app
from registry import db
from registry.db import session_scope
from registry.services.tokens import create_token, revoke_token
from registry.settings import Settings


def _client(settings: Settings, ttl: float) -> TestClient:
    return TestClient(create_app(settings.model_copy(update={"token_cache_seconds": ttl})))


def _token(settings: Settings, name: str, role: str = "reader") -> dict[str, str]:
    with session_scope(settings.db_url) as s:
        secret = create_token(s, name=name, role=role, actor="test").secret
    return {"Authorization": f"Bearer {secret}"}


def test_token_is_looked_up_once_within_the_ttl(sqlite_home: Settings) -> None:
    reader = _token(sqlite_home, "cached-reader")
    client = _client(sqlite_home, ttl=60)
    statements: list[str] = []
    engine = db.get_engine(sqlite_home.db_url)

    def count(_c, _cur, statement, *_a) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        for _ in range(5):
            assert client.get("/v1/pairs", headers=reader).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", count)
    token_reads = [s for s in statements if s.startswith("SELECT") and "FROM api_tokens" in s]
    assert len(token_reads) == 1, token_reads  # the first request only
    assert len(statements) > len(token_reads)  # the operations still read the database


def test_revocation_through_this_server_counts_at_once(sqlite_home: Settings) -> None:
    admin = _token(sqlite_home, "cache-admin", role="admin")
    victim = _token(sqlite_home, "cache-victim")
    client = _client(sqlite_home, ttl=60)
    assert client.get("/v1/whoami", headers=victim).status_code == 200  # remembered now
    assert client.delete("/v1/tokens/cache-victim", headers=admin).status_code == 200
    resp = client.get("/v1/whoami", headers=victim)
    assert resp.status_code == 401 and "revoked" in resp.json()["detail"]


def test_revocation_elsewhere_counts_within_the_ttl(sqlite_home: Settings) -> None:
    victim = _token(sqlite_home, "elsewhere-victim")
    client = _client(sqlite_home, ttl=0.5)
    assert client.get("/v1/whoami", headers=victim).status_code == 200
    with session_scope(sqlite_home.db_url) as s:  # another replica, or the CLI
        revoke_token(s, name="elsewhere-victim", actor="test")
    assert client.get("/v1/whoami", headers=victim).status_code == 200  # still remembered
    time.sleep(0.6)
    assert client.get("/v1/whoami", headers=victim).status_code == 401
    # with the cache off, at once
    other = _token(sqlite_home, "uncached-victim")
    uncached = _client(sqlite_home, ttl=0)
    assert uncached.get("/v1/whoami", headers=other).status_code == 200
    with session_scope(sqlite_home.db_url) as s:
        revoke_token(s, name="uncached-victim", actor="test")
    assert uncached.get("/v1/whoami", headers=other).status_code == 401


def test_unknown_and_wrong_role_tokens_are_not_remembered(sqlite_home: Settings) -> None:
    client = _client(sqlite_home, ttl=60)
    bad = {"Authorization": "Bearer prt_not-a-token"}
    assert client.get("/v1/whoami", headers=bad).status_code == 401
    assert client.app.state.token_cache._entries == {}  # type: ignore[attr-defined]
    reader = _token(sqlite_home, "reader-only")
    # a role check still applies to a remembered token, per operation
    assert client.get("/v1/pairs", headers=reader).status_code == 200
    resp = client.post("/v1/tokens", headers=reader, json={"name": "x", "role": "reader"})
    assert resp.status_code == 403
