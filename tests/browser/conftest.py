"""A seeded registry served on a free port, and headless Chromium driven by Selenium.

The browser is Debian's ``chromium`` with its ``chromium-driver`` (``.ci/run`` installs
both); Selenium is pointed at them explicitly, so nothing is downloaded at run time. Without
them the tests skip locally and fail in CI (``CI=true``), like the PostgreSQL tests.
Screenshots go to ``$PAIRREG_TEST_OUTPUT`` (default ``test-output/`` in the repository).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from registry.db import dispose_engines, session_scope
from registry.services.system import initialise, read_credentials
from registry.services.tokens import create_token
from registry.settings import Settings
from tests.browser.seed import Seeded, seed
from tests.browser.stand_ins import mount_missing
from tests.conftest import REPO

CHROMIUM = os.environ.get("PAIRREG_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PAIRREG_CHROMEDRIVER", "/usr/bin/chromedriver")
OUTPUT = Path(os.environ.get("PAIRREG_TEST_OUTPUT") or REPO / "test-output") / "dashboard"
DOWNLOADS = OUTPUT / "downloads"
REQUIRE_BROWSER = os.environ.get("CI") == "true"
WIDTH, HEIGHT = 1366, 900  # a laptop screen


@dataclass
class Served:
    base: str  # http://127.0.0.1:PORT/dashboard
    url: str  # database URL
    seeded: Seeded
    tokens: dict[str, str]  # role -> secret


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import uvicorn

    from api.app import create_app

    root = tmp_path_factory.mktemp("dashboard")
    settings = Settings(home=root / "home", database_url=f"sqlite:///{root / 'registry.db'}")
    initialise(settings)
    seeded = seed(settings.db_url, root, settings.signing_key_path)
    tokens = {"admin": (read_credentials(settings.credentials_path) or {})["token"]}
    with session_scope(settings.db_url) as s:
        for role in ("reader", "promoter", "auditor"):
            tokens[role] = create_token(s, name=f"ui-{role}", role=role, actor="test").secret
    app = create_app(settings)
    mount_missing(app)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the API server did not start"
        time.sleep(0.05)
    yield Served(f"http://127.0.0.1:{port}/dashboard", settings.db_url, seeded, tokens)
    server.should_exit = True
    thread.join(timeout=10)
    dispose_engines()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        message = (
            f"headless browser tests need {', '.join(missing)} "
            "(apt-get install chromium chromium-driver)"
        )
        if REQUIRE_BROWSER:
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WIDTH},{HEIGHT}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(DOWNLOADS), "download.prompt_for_download": False},
    )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
