"""``/docs`` in a real headless Chromium: Swagger UI renders every operation from the
server's own assets, and the page's Content-Security-Policy refuses nothing it needs."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser.conftest import Served

pytestmark = pytest.mark.browser


def test_swagger_ui_renders_under_its_csp(browser: Any, served: Served) -> None:
    base = served.base.removesuffix("/dashboard")
    browser.get("about:blank")
    browser.get_log("browser")
    browser.get(f"{base}/docs")
    count = "return document.querySelectorAll('.opblock').length"
    WebDriverWait(browser, 30).until(lambda d: d.execute_script(count) > 20)
    assert browser.execute_script("return document.querySelector('.title').textContent")
    assert "pairreg" in browser.execute_script(
        "return document.querySelector('.title').textContent"
    )
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
    )
    assert origins and set(origins) == {base}
