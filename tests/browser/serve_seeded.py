"""Serve a freshly seeded registry for looking at the dashboard by hand:

    .venv/bin/python -m tests.browser.serve_seeded [PORT]

prints the dashboard URL with the admin token and one reader token; Ctrl-C stops it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import uvicorn

from api.app import create_app
from registry.db import session_scope
from registry.services.system import initialise, read_credentials
from registry.services.tokens import create_token
from registry.settings import Settings
from tests.browser.seed import seed


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    root = Path(tempfile.mkdtemp(prefix="pairreg-dash-"))
    settings = Settings(home=root / "home", database_url=f"sqlite:///{root / 'registry.db'}")
    initialise(settings)
    seeded = seed(settings.db_url, root, settings.signing_key_path)
    admin = (read_credentials(settings.credentials_path) or {})["token"]
    with session_scope(settings.db_url) as s:
        reader = create_token(s, name="reader", role="reader", actor="seed").secret
    base = f"http://127.0.0.1:{port}/dashboard"
    print(f"admin:  {base}#token={admin}\nreader: {base}#token={reader}\n{seeded}", flush=True)
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
