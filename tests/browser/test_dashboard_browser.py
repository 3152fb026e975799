"""The dashboard in a real headless Chromium over a seeded registry.

Every page loads with no console error; the charts draw the series and points the seed
implies (read from the chart elements' data attributes and their uPlot objects, checked
against the API's own numbers); a request id look-up shows the pair that served it and
downloads its bundle; a reader sees no button it cannot use, a promoter can acknowledge a
flag; pages fit a laptop screen. A screenshot of each page is saved under test-output/.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import seed as seed_module
from tests.browser.conftest import DOWNLOADS, OUTPUT, WIDTH, Served

pytestmark = pytest.mark.browser

TIMEOUT = 30


def sign_in(driver: Any, served: Served, role: str) -> None:
    driver.get("about:blank")  # a fresh document: the page reads #token= when it loads
    driver.get(f"{served.base}#token={served.tokens[role]}")
    wait_ready(driver, "#/")
    driver.get_log("browser")  # start each page with an empty console


def wait_ready(driver: Any, route: str) -> None:
    def ready(d: Any) -> bool:
        view = d.find_element(By.ID, "view")
        return view.get_attribute("data-route") == route and view.get_attribute("data-state") in (
            "ready",
            "error",
        )

    WebDriverWait(driver, TIMEOUT).until(ready)
    state = driver.find_element(By.ID, "view").get_attribute("data-state")
    assert state == "ready", driver.find_element(By.ID, "view").text


def open_page(driver: Any, route: str) -> None:
    driver.execute_script("location.hash = arguments[0]", route)
    wait_ready(driver, route)


def console_errors(driver: Any) -> list[str]:
    """SEVERE console entries, less a refused economics request: that operation may decline
    a pair it cannot price (the page then shows its reason), and Chrome logs every 4xx."""
    return [
        e["message"]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "/economics" not in e["message"]
    ]


def screenshot(driver: Any, name: str) -> None:
    """The whole page (beyond the viewport, capped at 5000 px), through the DevTools protocol."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": WIDTH, "height": min(size["height"], 5000), "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path = OUTPUT / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.stat().st_size > 10_000  # a real rendering, not a blank page


def chart(driver: Any, element_id: str) -> dict[str, Any]:
    """What a chart drew: its data attributes and the uPlot object's series and data."""
    return driver.execute_script(
        """const el = document.getElementById(arguments[0]);
        return {series: +el.dataset.series, points: +el.dataset.points,
                markers: +el.dataset.markers, labels: el.dataset.labels.split('|'),
                canvas: !!el.querySelector('canvas'),
                uplot_series: el.uplot ? el.uplot.series.length : 0,
                data: el.uplot ? el.uplot.data : null};""",
        element_id,
    )


def api_get(served: Served, path: str, role: str = "admin") -> Any:
    base = served.base.removesuffix("/dashboard")
    resp = httpx.get(base + path, headers={"Authorization": f"Bearer {served.tokens[role]}"})
    resp.raise_for_status()
    return resp.json()


def pages(served: Served) -> dict[str, str]:
    s = served.seeded
    return {
        "overview": "#/",
        "deployment": f"#/deployment/{seed_module.DEPLOYMENT}",
        "pair": f"#/pair/{s.live_digest}",
        "flag": f"#/flag/{s.flag_id}",
        "request": f"#/request/{s.request_ids[1]}",
        "audit": "#/audit",
    }


def test_every_page_loads_without_console_errors(browser: Any, served: Served) -> None:
    sign_in(browser, served, "admin")
    for name in pages(served):
        (OUTPUT / f"{name}.png").unlink(missing_ok=True)
    for name, route in pages(served).items():
        open_page(browser, route)
        assert console_errors(browser) == [], name
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth"
        )
        assert overflow <= 0, f"{name} is wider than a laptop screen by {overflow}px"
        screenshot(browser, name)
    assert set(pages(served)) <= {p.stem for p in OUTPUT.glob("*.png")}


def test_charts_draw_the_seeded_series_and_points(browser: Any, served: Served) -> None:
    sign_in(browser, served, "admin")
    cats = list(seed_module.CATEGORIES)
    open_page(browser, pages(served)["deployment"])
    alpha = chart(browser, "alpha-chart")
    assert alpha["canvas"]
    assert alpha["series"] == len(cats) and alpha["labels"] == cats
    assert alpha["points"] == served.seeded.measurements == len(seed_module.LIVE_ALPHAS) + 1
    # two moves, one target change (v2 of the target lineage), one drift flag
    assert alpha["markers"] == 4
    # each category: its α line plus the low and high edges of its band (x is series 0)
    assert alpha["uplot_series"] == 1 + 3 * len(cats)
    # The plotted values are the API's: live pair's measurements then the candidate's.
    measured = [
        m
        for digest in (served.seeded.live_digest, served.seeded.candidate_digest)
        for m in api_get(served, f"/v1/measurements?pair={digest}")["items"]
    ]
    measured.sort(key=lambda m: m["created_at"])
    for i, cat in enumerate(cats):
        line, low, high = alpha["data"][1 + 3 * i : 4 + 3 * i]
        assert line == pytest.approx([m["categories"][cat]["alpha"] for m in measured])
        assert all(lo < a < hi for lo, a, hi in zip(low, line, high, strict=True))
    assert alpha["data"][1][-1] < alpha["data"][1][0] - 0.2  # the candidate's drop on code

    open_page(browser, pages(served)["pair"])
    pos = chart(browser, "position-chart")
    assert pos["series"] == len(cats) and pos["points"] == seed_module.K
    for line in pos["data"][1:]:
        assert line == sorted(line, reverse=True)  # later positions accept less

    open_page(browser, pages(served)["flag"])
    flag = chart(browser, "flag-chart")
    assert flag["series"] == 2 and flag["points"] == len(cats)
    effects = api_get(served, f"/v1/drift/{served.seeded.flag_id}")["effects"]["categories"]
    assert flag["data"][1] == pytest.approx([effects[c]["baseline_alpha"] for c in cats])
    assert flag["data"][2] == pytest.approx([effects[c]["candidate_alpha"] for c in cats])

    # Online α and request volume from serving telemetry, on the α chart's time axis.
    open_page(browser, pages(served)["deployment"])
    online = api_get(served, f"/v1/deployments/{seed_module.DEPLOYMENT}/online-alpha")
    buckets = online["buckets"]
    assert buckets, "the seeded requests carry counters: some bucket must exist"
    drawn = chart(browser, "online-chart")
    assert drawn["points"] == len(buckets) and drawn["labels"][0] == "online α"
    assert drawn["data"][1] == pytest.approx([b["alpha"] for b in buckets])
    if any(b.get("validated_alpha") is not None for b in buckets):
        assert drawn["series"] == 2 and drawn["labels"][1] == "validated α"
    volume = chart(browser, "volume-chart")
    assert volume["points"] == len(buckets)
    assert volume["data"][1] == [b["requests"] for b in buckets]
    same_axis = browser.execute_script(
        "const r = (id) => { const u = document.getElementById(id).uplot;"
        " return [u.scales.x.min, u.scales.x.max]; };"
        " return [r('alpha-chart'), r('online-chart'), r('volume-chart')];"
    )
    assert same_axis[0] == same_axis[1] == same_axis[2]

    # Economics: the predicted speed-up by batch size where the server prices the pair,
    # else a plain line saying why not.
    open_page(browser, pages(served)["pair"])
    base = served.base.removesuffix("/dashboard")
    resp = httpx.get(
        f"{base}/v1/pairs/{served.seeded.live_digest}/economics",
        headers={"Authorization": f"Bearer {served.tokens['admin']}"},
    )
    text = browser.find_element(By.ID, "economics").text
    if resp.status_code == 200 and "points" in resp.json():
        points = resp.json()["points"]
        econ = chart(browser, "economics-chart")
        assert econ["points"] == len(points) and econ["labels"][0] == "predicted speed-up"
        assert econ["data"][1] == pytest.approx([p["speedup"] for p in points])
    else:
        assert "no economics figures" in text, text


def test_request_lookup_shows_its_pair_and_downloads_the_bundle(
    browser: Any, served: Served
) -> None:
    sign_in(browser, served, "auditor")
    for old in DOWNLOADS.glob("*.json"):
        old.unlink()
    open_page(browser, "#/request")
    rid = served.seeded.request_ids[3]
    field = browser.find_element(By.ID, "request-id")
    field.send_keys(rid)
    browser.find_element(By.CSS_SELECTOR, "#lookup button").click()
    wait_ready(browser, f"#/request/{rid}")
    assert browser.find_element(By.ID, "answer-request").text == rid
    pair = browser.find_element(By.CSS_SELECTOR, "#answer-pair a")
    assert pair.get_attribute("href").endswith(f"#/pair/{served.seeded.live_digest}")
    assert served.seeded.live_digest in browser.find_element(By.ID, "answer").text
    assert "consistent" in browser.find_element(By.ID, "answer").text
    browser.find_element(By.ID, "bundle").click()
    link = WebDriverWait(browser, TIMEOUT).until(lambda d: d.find_element(By.ID, "bundle-link"))
    assert link.get_attribute("download") == f"pairreg-bundle-{rid}.json"
    saved = DOWNLOADS / f"pairreg-bundle-{rid}.json"
    deadline = time.monotonic() + TIMEOUT
    while not saved.exists():
        assert time.monotonic() < deadline, f"no download at {saved}"
        time.sleep(0.1)
    bundle = json.loads(saved.read_text())
    again = api_get(served, f"/v1/requests/{rid}/bundle", role="auditor")
    # the same bundle: the log has not grown, so both prove into the same signed checkpoint
    assert bundle == again and bundle["tag"]["pair_digest"] == served.seeded.live_digest
    assert console_errors(browser) == []


def test_a_reader_sees_no_button_it_cannot_use(browser: Any, served: Served) -> None:
    sign_in(browser, served, "reader")
    nav = browser.find_element(By.ID, "nav").text
    assert "Audit" not in nav and "Request" not in nav
    for name, route in pages(served).items():
        open_page(browser, route)
        buttons = browser.find_elements(By.CSS_SELECTOR, "#view button, #view [data-action]")
        assert buttons == [], f"{name}: {[b.text for b in buttons]}"
        assert console_errors(browser) == [], name
        if name in ("request", "audit"):
            assert "reader cannot read" in browser.find_element(By.ID, "view").text
        screenshot(browser, f"reader-{name}")


def test_a_promoter_acknowledges_a_flag_from_its_page(browser: Any, served: Served) -> None:
    sign_in(browser, served, "promoter")
    route = pages(served)["flag"]
    open_page(browser, route)
    actions = {
        b.get_attribute("data-action")
        for b in browser.find_elements(By.CSS_SELECTOR, "#view [data-action]")
    }
    assert actions == {"ack", "resolve"}
    browser.find_element(By.ID, "flag-reason").send_keys("retraining the drafter")
    browser.find_element(By.CSS_SELECTOR, "[data-action=ack]").click()
    deadline = time.monotonic() + TIMEOUT
    while api_get(served, f"/v1/drift/{served.seeded.flag_id}")["state"] != "acknowledged":
        assert time.monotonic() < deadline, "the flag was not acknowledged"
        time.sleep(0.1)
    flag = api_get(served, f"/v1/drift/{served.seeded.flag_id}")
    assert flag["closed_by"] == "token:ui-promoter" and flag["reason"] == "retraining the drafter"
    wait_ready(browser, route)
    assert console_errors(browser) == []


def test_a_promoter_deprecates_a_pair_and_sees_a_refusal_on_the_live_one(
    browser: Any, served: Served
) -> None:
    sign_in(browser, served, "promoter")
    live = f"#/pair/{served.seeded.live_digest}"
    open_page(browser, live)
    browser.find_element(By.ID, "pair-reason").send_keys("try")
    browser.find_element(By.CSS_SELECTOR, "[data-action=deprecate]").click()
    refusal = WebDriverWait(browser, TIMEOUT).until(
        lambda d: d.find_element(By.ID, "pair-action-out").text
    )
    assert "move it off every deployment" in refusal  # the server refuses; the page says why
    assert api_get(served, f"/v1/pairs/{served.seeded.live_digest}")["status"] == "promoted"
    # the refused POST is logged by Chrome: expected, and nothing else
    assert all("deprecate" in message for message in console_errors(browser))

    other = f"#/pair/{served.seeded.other_digest}"
    open_page(browser, other)
    browser.find_element(By.ID, "pair-reason").send_keys("superseded by draft v1")
    browser.find_element(By.CSS_SELECTOR, "[data-action=deprecate]").click()
    deadline = time.monotonic() + TIMEOUT
    while api_get(served, f"/v1/pairs/{served.seeded.other_digest}")["status"] != "deprecated":
        assert time.monotonic() < deadline, "the pair was not deprecated"
        time.sleep(0.1)
    wait_ready(browser, other)
    assert browser.find_elements(By.CSS_SELECTOR, "[data-action=deprecate]") == []
    assert console_errors(browser) == []


def test_audit_events_filter_by_action(browser: Any, served: Served) -> None:
    sign_in(browser, served, "auditor")
    open_page(browser, "#/audit")
    assert "intact" in browser.find_element(By.ID, "log").text
    total = int(browser.find_element(By.ID, "events").get_attribute("data-count"))
    browser.find_element(By.CSS_SELECTOR, "#filter input[name=action]").send_keys(
        "deployment.promote"
    )
    browser.find_element(By.CSS_SELECTOR, "#filter button").click()
    wait_ready(browser, "#/audit?action=deployment.promote")
    events = browser.find_element(By.ID, "events")
    promotes = api_get(served, "/v1/audit/events?action=deployment.promote", role="auditor")
    assert int(events.get_attribute("data-count")) == len(promotes["items"]) == 2 < total
    rows = events.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 2 and all("deployment.promote" in r.text for r in rows)
    assert console_errors(browser) == []
