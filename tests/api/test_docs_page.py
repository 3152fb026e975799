"""``/docs`` serves Swagger UI from this server under a Content-Security-Policy: no CDN, no
inline script, every asset from the package (vendored with its license and digests).
The browser check (Swagger UI renders under that policy) is in
``tests/browser/test_docs_browser.py``."""

from __future__ import annotations

import hashlib
import re

from fastapi.testclient import TestClient

from api.routes.dashboard import STATIC
from tests.api.test_dashboard import _client


def test_docs_page_loads_only_this_origin_under_a_csp() -> None:
    client: TestClient = _client()
    page = client.get("/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "connect-src 'self'",
                      "object-src 'none'", "frame-ancestors 'none'"):  # fmt: skip
        assert directive in csp, directive
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "http" not in csp
    # no CDN, no protocol-relative URL, no inline script
    assert not re.search(r'(?:src|href)="(https?:)?//', page.text)
    assert "cdn" not in page.text.lower()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, re.S)
    assert scripts and all('src="' in attrs and not body.strip() for attrs, body in scripts)
    assets = re.findall(r'(?:src|href)="(/[^"]+)"', page.text)
    assert len(assets) >= 4
    for asset in assets:
        resp = client.get(asset)
        assert resp.status_code == 200 and len(resp.content) > 100, asset
    bundle = client.get("/dashboard/static/vendor/swagger-ui/swagger-ui-bundle.js")
    assert bundle.headers["content-type"].startswith("text/javascript")
    assert "SwaggerUIBundle" in bundle.text
    url = re.search(r'data-openapi-url="([^"]+)"', page.text)
    assert url and client.get(url.group(1)).json()["info"]["title"] == "pairreg"
    # FastAPI's CDN pages are gone
    for gone in ("/redoc", "/docs/oauth2-redirect"):
        assert client.get(gone).status_code == 404, gone


def test_vendored_swagger_ui_matches_its_recorded_digests_and_license() -> None:
    vendor = STATIC / "vendor" / "swagger-ui"
    entries = [line.split() for line in (vendor / "SHA256SUMS").read_text().splitlines() if line]
    assert {name for _, name in entries} == {
        "swagger-ui-bundle.js",
        "swagger-ui-bundle.js.LICENSE.txt",
        "swagger-ui.css",
        "favicon-32x32.png",
        "LICENSE",
        "NOTICE",
    }
    for digest, name in entries:
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    assert "Apache License" in (vendor / "LICENSE").read_text()
