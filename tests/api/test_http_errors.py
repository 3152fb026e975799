"""Client mistakes get problem+json with the right status and field, never a 500; probes;
token storage and bookkeeping."""

from __future__ import annotations

import hashlib
import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from registry.db import get_engine
from registry.governance.roles import ROLES
from tests.api.conftest import ApiEnv
from tests.fixtures import write_fake_model


def _problem(resp, status: int, field: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if field is not None:
        assert body["field"] == field, body
    return body


def _add(api: ApiEnv, source: Path, name: str, role: str = "target") -> dict:
    resp = api.client.post(
        "/v1/artifacts",
        json={"source": str(source), "name": name, "role": role},
        headers=api.auth("registrar"),
    )
    assert resp.status_code in (200, 201), resp.text
    return resp.json()


def test_bad_input_is_never_a_500(api: ApiEnv, tmp_path: Path) -> None:
    target = _add(api, write_fake_model(tmp_path / "t"), "acme/t")
    assert target["created"] is True and target["artifact"]["registered_by"] == "token:t-registrar"
    h = {**api.auth(), "content-type": "application/json"}
    c = api.client

    _problem(c.post("/v1/pairs", content=b'{"target": ', headers=h), 422)
    _problem(c.post("/v1/pairs", content=b"\xff\xfe", headers=h), 422, "body")
    body = {"target": "acme/t@v1", "method": "prompt_lookup", "k": "four"}
    _problem(c.post("/v1/pairs", json=body, headers=h), 422, "k")
    body = {"target": "acme/t@v1", "method": "prompt_lookup", "k": 4, "colour": "red"}
    _problem(c.post("/v1/pairs", json=body, headers=h), 422, "colour")
    body = {"target": "acme/nope@v1", "method": "prompt_lookup", "k": 4}
    _problem(c.post("/v1/pairs", json=body, headers=h), 404, "target")
    _problem(c.get("/v1/artifacts/acme/nope@v3", headers=h), 404, "ref")
    _problem(c.get("/v1/artifacts/not a ref", headers=h), 422, "ref")
    _problem(c.get("/v1/pairs/999", headers=h), 404, "pair")
    _problem(c.get("/v1/artifacts", params={"cursor": "bm90LWFuLWludA"}, headers=h), 422, "cursor")
    _problem(c.get("/v1/artifacts", params={"cursor": "***"}, headers=h), 422, "cursor")
    _problem(c.get("/v1/artifacts", params={"limit": 0}, headers=h), 422, "limit")
    _problem(c.get("/v1/artifacts", params={"limt": 5}, headers=h), 422, "limt")
    _problem(c.get("/v1/artifacts?role=target&role=draft", headers=h), 422, "role")
    _problem(c.get("/v1/audit/events", params={"since": "0.5"}, headers=h), 422, "since")
    _problem(
        c.get("/v1/audit/events", params={"since": "2025-01-01T00:00:00"}, headers=h), 422, "since"
    )
    _problem(
        c.post(
            "/v1/artifacts",
            json={"source": str(tmp_path / "missing"), "name": "a", "role": "draft"},
            headers=h,
        ),
        422,
        "source",
    )
    # The same lineage cannot hold two roles.
    clash = {
        "source": str(write_fake_model(tmp_path / "d", weights=b"d")),
        "name": "acme/t",
        "role": "draft",
    }
    _problem(c.post("/v1/artifacts", json=clash, headers=h), 409, "role")
    _problem(
        c.post("/v1/tokens", json={"name": "t-reader", "role": "reader"}, headers=h), 409, "name"
    )
    _problem(c.post("/v1/tokens", json={"name": "x", "role": "root"}, headers=h), 422, "role")
    _problem(c.delete("/v1/tokens/nobody", headers=h), 404, "name")
    resp = c.put("/v1/artifacts", headers=h)
    _problem(resp, 405)
    assert set(resp.headers["allow"].split(", ")) == {"GET", "POST"}
    resp = c.get("/v1/artifacts/acme/t@v1/verify", headers=h)
    _problem(resp, 405)
    assert resp.headers["allow"] == "POST"
    _problem(c.get("/v1/nothing-here", headers=h), 404)
    # Ids beyond the column type (int4 on PostgreSQL, int64 in SQLite's driver): never a 500.
    for url in ("/v1/artifacts/99999999999", "/v1/pairs/99999999999"):
        assert c.get(url, headers=h).status_code in (404, 422)
    for name in ("drift", "jobs", "measurements", "validations"):
        resp = c.get(f"/v1/{name}/9223372036854775808", headers=h)
        assert resp.status_code in (404, 422), (name, resp.text)


def test_ambiguous_digest_prefix_is_422(api: ApiEnv, tmp_path: Path) -> None:
    a = _add(api, write_fake_model(tmp_path / "a", weights=b"a"), "acme/a")["artifact"]
    b = _add(api, write_fake_model(tmp_path / "b", weights=b"b"), "acme/b")["artifact"]
    prefix = "abcdef012345"
    with get_engine(api.settings.db_url).begin() as conn:
        for art, tail in ((a, "0"), (b, "1")):
            conn.execute(
                text("UPDATE artifacts SET manifest_digest = :d WHERE id = :i"),
                {"d": prefix + tail * 52, "i": art["id"]},
            )
    resp = api.client.get(f"/v1/artifacts/{prefix}", headers=api.auth())
    assert "ambiguous" in _problem(resp, 422, "ref")["detail"]
    ok = api.client.get(f"/v1/artifacts/{prefix}1111", headers=api.auth())
    assert ok.status_code == 200 and ok.json()["id"] == b["id"]


def test_probes_and_out_of_date_schema(api: ApiEnv) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok", "schema_revision": None}
    ready = api.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    with get_engine(api.settings.db_url).begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    stale = api.client.get("/readyz")
    assert "0001" in _problem(stale, 503)["detail"]
    assert api.client.get("/healthz").status_code == 200


def test_readyz_shows_no_database_error_text(api: ApiEnv, caplog) -> None:  # type: ignore[no-untyped-def]
    """The probe is public: a database error says only that the database is unreachable;
    the driver's text (host, port, user, database name) goes to the server log."""
    good = api.app.state.db_url
    api.app.state.db_url = "postgresql+psycopg://leakyuser:pw@127.0.0.1:9/leakydb"
    try:
        with caplog.at_level("WARNING", logger="pairreg.api"):
            down = api.client.get("/readyz")
    finally:
        api.app.state.db_url = good
    body = _problem(down, 503)
    assert body["kind"] == "database" and body["detail"].startswith("the database is unreachable")
    for secret in ("leakyuser", "leakydb", "127.0.0.1", "psycopg", "refused"):
        assert secret not in down.text
    assert "127.0.0.1" in caplog.text  # the operator still learns why


def test_tokens_are_stored_hashed_and_bookkept(api: ApiEnv) -> None:
    creds_path = api.settings.credentials_path
    assert stat.S_IMODE(creds_path.stat().st_mode) == 0o600
    assert json.loads(creds_path.read_text())["token"] == api.admin

    created = api.client.post(
        "/v1/tokens", json={"name": "ci", "role": "reader"}, headers=api.auth()
    )
    assert created.status_code == 201
    secret = created.json()["secret"]
    assert secret.startswith("prt_") and len(secret) >= 4 + 43  # 32 random bytes, base64url
    assert created.json()["token"]["created_by"] == "token:admin"
    with get_engine(api.settings.db_url).connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text("SELECT * FROM api_tokens"))]
    stored = next(r for r in rows if r["name"] == "ci")
    assert stored["token_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert not any(secret in str(v) for r in rows for v in r.values())
    assert not any(api.admin in str(v) for r in rows for v in r.values())

    before = datetime.now(UTC) - timedelta(seconds=5)
    assert api.client.get("/v1/pairs", headers={"Authorization": f"Bearer {secret}"}).is_success
    listed = {
        t["name"]: t for t in api.client.get("/v1/tokens", headers=api.auth()).json()["items"]
    }
    used = datetime.fromisoformat(listed["ci"]["last_used_at"].replace("Z", "+00:00"))
    assert used >= before
    assert listed["t-promoter"]["last_used_at"] is None  # never presented

    revoked = api.client.delete("/v1/tokens/ci", headers=api.auth())
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    resp = api.client.get("/v1/pairs", headers={"Authorization": f"Bearer {secret}"})
    assert "revoked" in _problem(resp, 401)["detail"]
    events = api.client.get(
        "/v1/audit/events",
        params={"entity_type": "token", "action": "token.revoked"},
        headers=api.auth("auditor"),
    ).json()["items"]
    assert [(e["actor"], e["payload"]["name"]) for e in events][-1] == ("token:admin", "ci")


def test_pagination_and_event_filters(api: ApiEnv) -> None:
    for i in range(5):
        assert (
            api.client.post(
                "/v1/tokens", json={"name": f"p{i}", "role": "reader"}, headers=api.auth()
            ).status_code
            == 201
        )
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = api.client.get("/v1/tokens", params=params, headers=api.auth()).json()
        seen += [t["name"] for t in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if not cursor:
            break
    # admin, one token per other role, a revoked one, p0..p4
    assert len(seen) == len(set(seen)) == 1 + (len(ROLES) - 1) + 1 + 5
    assert pages == -(-len(seen) // 3)  # pages of 3

    h = api.auth("auditor")
    everything = api.client.get("/v1/audit/events", params={"limit": 500}, headers=h).json()
    seqs = [e["seq"] for e in everything["items"]]
    assert seqs == list(range(1, len(seqs) + 1))
    by_actor = api.client.get("/v1/audit/events", params={"actor": "token:admin"}, headers=h)
    assert {e["payload"]["name"] for e in by_actor.json()["items"]} >= {f"p{i}" for i in range(5)}
    middle = everything["items"][len(seqs) // 2]
    since = api.client.get(
        "/v1/audit/events", params={"since": middle["occurred_at"]}, headers=h
    ).json()["items"]
    assert since and all(e["occurred_at"] >= middle["occurred_at"] for e in since)
    one = api.client.get(
        "/v1/audit/events",
        params={"entity_type": "token", "entity_id": middle["entity_id"]},
        headers=h,
    ).json()["items"]
    assert {e["entity_id"] for e in one} == {middle["entity_id"]}
