"""The dashboard's static side: what it loads is served from the package, and every API path
its script calls is one the API declares.

The page is static JavaScript over the public API, so the contract that can break is the
one between the script and the OpenAPI schema: a renamed route would leave a page empty.
The browser tests (tests/browser) drive the page itself.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from api.routes.dashboard import STATIC
from registry.settings import Settings

SCRIPT = STATIC / "dashboard" / "dashboard.js"
# "/v1/…" and `/v1/…${x}…` literals in the script, up to a query string or the literal's end.
API_PATH = re.compile(r"[\"`](/v1/[^\"`?]*)")
# Endpoints other parts of the service may or may not serve: the page looks them up in the
# OpenAPI document first and says "no data" when they are absent.
OPTIONAL = (r"/v1/deployments/\{[^}]+\}/online-alpha", r"/v1/pairs/\{[^}]+\}/economics")


def _client() -> TestClient:
    return TestClient(create_app(Settings(database_url="sqlite:///:memory:")))


def _as_regex(template: str) -> re.Pattern[str]:
    """A schema path template as a regex that matches the script's ``${…}`` fill-ins."""
    parts = re.split(r"\{[^}]+\}", template)
    return re.compile("^" + r"(\$\{[^}]+\}|[^/]+)".join(map(re.escape, parts)) + "$")


def test_every_api_path_the_script_calls_is_declared() -> None:
    schema = _client().get("/openapi.json").json()
    templates = [_as_regex(p) for p in schema["paths"]]
    used = set(API_PATH.findall(SCRIPT.read_text(encoding="utf-8")))
    assert len(used) >= 15, used
    undeclared = sorted(u for u in used if not any(t.match(u) for t in templates))
    assert undeclared == [], f"the dashboard calls routes the API does not serve: {undeclared}"


def test_optional_endpoints_are_discovered_not_probed() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    for pattern in OPTIONAL:
        assert pattern.replace("/", r"\/") in text or pattern in text, pattern


def test_page_and_assets_are_served_from_the_package() -> None:
    client = _client()
    page = client.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/", follow_redirects=False).headers["location"] == "/dashboard"
    assets = re.findall(r'(?:src|href)="(/dashboard/static/[^"]+)"', page.text)
    assert len(assets) >= 5 and not re.search(r'(?:src|href)="(https?:)?//', page.text)
    for asset in assets:
        resp = client.get(asset)
        assert resp.status_code == 200 and resp.content, asset
    assert (
        client.get("/dashboard/static/dashboard/dashboard.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    for bad in ("../routes/dashboard.py", "..%2F..%2Fapp.py", "dashboard/nope.js"):
        assert client.get(f"/dashboard/static/{bad}").status_code == 404, bad


def test_vendored_uplot_matches_its_recorded_digests() -> None:
    vendor = STATIC / "vendor" / "uplot"
    sums = (vendor / "SHA256SUMS").read_text().split("\n")
    entries = [line.split() for line in sums if line.strip()]
    assert {name for _, name in entries} == {"uPlot.iife.min.js", "uPlot.min.css", "LICENSE"}
    for digest, name in entries:
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    assert "MIT" in Path(vendor / "LICENSE").read_text()
