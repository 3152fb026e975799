"""The dashboard page reads only routes the API serves and fields their schemas declare.

The page is static JavaScript over the public API, so the contract that can break is the
one between its panels and the OpenAPI schema: a renamed route or field would leave a
panel silently empty. This test parses the page and checks each panel against the schema.
"""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from api.app import create_app

PANEL = re.compile(r'panel\("(?P<id>\w+)", "(?P<path>[^"?]+)[^"]*", \[(?P<cols>.*?)\n    \]', re.S)
FIELD = re.compile(r"\((\w)\) => [^\]]*?\b\1\.(\w+)")


def _item_schema(schema: dict, path: str) -> dict:
    op = schema["paths"][path]["get"]
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    page = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    item_ref = page["properties"]["items"]["items"]["$ref"]
    return schema["components"]["schemas"][item_ref.rsplit("/", 1)[-1]]


def test_dashboard_panels_match_the_api_schema(sqlite_url: str, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PAIRREG_HOME", str(tmp_path))
    monkeypatch.setenv("PAIRREG_DATABASE_URL", sqlite_url)
    from registry.settings import reset_settings

    reset_settings()
    client = TestClient(create_app())
    page = client.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard"
    schema = client.get("/openapi.json").json()
    panels = list(PANEL.finditer(page.text))
    assert {p["id"] for p in panels} == {"deployments", "drift", "jobs", "pairs", "audit"}
    for panel in panels:
        path = panel["path"]
        assert path in schema["paths"], f"panel {panel['id']} reads {path}, which is not served"
        declared = set(_item_schema(schema, path)["properties"])
        used = {m.group(2) for m in FIELD.finditer(panel["cols"])}
        assert used, f"no fields parsed for panel {panel['id']}"
        assert used <= declared, f"panel {panel['id']} reads undeclared fields {used - declared}"
    reset_settings()
