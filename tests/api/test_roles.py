"""Every role against every route: 401 without, with a bad or a revoked token; 403 for a
role not admitted; anything but 401/403 (and never 5xx) for a role admitted."""

from __future__ import annotations

import re

from fastapi import FastAPI

from api.app import create_app
from api.route_index import iter_routes
from registry.governance.roles import ROLES
from registry.settings import Settings
from tests.api.conftest import ApiEnv
from tests.api.role_table import DEFAULT_PATH_VALUE, PATH_VALUES, PUBLIC, ROLE_TABLE, SIGNED

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def _routes(app: FastAPI) -> list[tuple[str, str]]:
    out = []
    for route in iter_routes(app):
        for method in sorted(route.methods - {"HEAD"}):
            out.append((method, route.path))
    return out


def _url(path: str) -> str:
    return _PARAM.sub(lambda m: PATH_VALUES.get(m.group(1), DEFAULT_PATH_VALUE), path)


def _send(api: ApiEnv, method: str, path: str, headers: dict[str, str]) -> int:
    kwargs = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    resp = api.client.request(method, _url(path), headers=headers, follow_redirects=False, **kwargs)
    return resp.status_code


def test_every_route_has_a_declared_role() -> None:
    served = set(_routes(create_app(Settings(database_url="sqlite:///:memory:"))))
    missing = sorted(served - set(ROLE_TABLE))
    stale = sorted(set(ROLE_TABLE) - served)
    assert not missing, f"routes without an entry in tests/api/role_table.py: {missing}"
    assert not stale, f"role_table.py entries for routes that no longer exist: {stale}"


def test_role_matrix(api: ApiEnv) -> None:
    """One pass over the matrix, collecting every mismatch so a failure lists them all."""
    bad_tokens = {
        "none": {},
        "unknown": {"Authorization": "Bearer prt_not-a-real-token"},
        "not bearer": {"Authorization": f"Basic {api.admin}"},
        "revoked": {"Authorization": f"Bearer {api.revoked}"},
    }
    problems: list[str] = []
    checked = 0
    for method, path in _routes(api.app):
        admitted = ROLE_TABLE.get((method, path))
        if admitted is None:
            continue  # reported by test_every_route_has_a_declared_role
        if admitted is SIGNED:  # no token opens it: only a valid signature
            for headers in [{}, *bad_tokens.values(), *(api.auth(r) for r in ROLES)]:
                status = _send(api, method, path, headers)
                checked += 1
                if status != 401:
                    problems.append(f"{method} {path} unsigned: expected 401, got {status}")
            continue
        if admitted is PUBLIC:
            status = _send(api, method, path, {})
            checked += 1
            if status in (401, 403) or status >= 500:
                problems.append(f"{method} {path} public: got {status}")
            continue
        for label, headers in bad_tokens.items():
            status = _send(api, method, path, headers)
            checked += 1
            if status != 401:
                problems.append(f"{method} {path} token {label}: expected 401, got {status}")
        for role in ROLES:
            status = _send(api, method, path, api.auth(role))
            checked += 1
            if role in admitted and (status in (401, 403) or status >= 500):
                problems.append(f"{method} {path} as {role}: admitted but got {status}")
            if role not in admitted and status != 403:
                problems.append(f"{method} {path} as {role}: expected 403, got {status}")
    assert checked > 5 * len(ROLE_TABLE)
    assert not problems, "\n".join(problems)


def test_unauthorized_is_problem_json_with_challenge(api: ApiEnv) -> None:
    resp = api.client.get("/v1/artifacts")
    assert resp.status_code == 401
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.headers["www-authenticate"] == "Bearer"
    body = resp.json()
    assert body["status"] == 401 and body["kind"] == "unauthorized"

    resp = api.client.get("/v1/tokens", headers=api.auth("reader"))
    assert resp.status_code == 403
    assert resp.json()["kind"] == "forbidden"
    assert "reader" in resp.json()["detail"]


def test_only_admin_manages_tokens(api: ApiEnv) -> None:
    for role in ("registrar", "promoter", "ingest", "auditor", "reader"):
        body = {"name": f"x-{role}", "role": "admin"}
        assert api.client.post("/v1/tokens", json=body, headers=api.auth(role)).status_code == 403
        revoke = api.client.delete("/v1/tokens/admin", headers=api.auth(role))
        assert revoke.status_code == 403
    listed = api.client.get("/v1/tokens", headers=api.auth()).json()["items"]
    assert not [t for t in listed if t["name"].startswith("x-")]
    assert next(t for t in listed if t["name"] == "admin")["revoked_at"] is None
