"""``pairreg serve``: initialise the embedded registry if needed and run the API."""

from __future__ import annotations

import os
from functools import partial

import typer

from cli.render import console
from registry.services.system import initialise
from registry.settings import get_settings


def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="Port to listen on."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Run the REST API (and dashboard) with uvicorn."""
    import uvicorn

    from api.app import create_app

    settings = get_settings()
    report = initialise(settings)
    # soft_wrap: paths and URLs stay on one line, copyable, however narrow the terminal.
    say = partial(console.print, soft_wrap=True, highlight=False)
    say(f"pairreg API on http://{host}:{port}  (docs: http://{host}:{port}/docs)")
    say(f"database: {report.database_url}")
    say(f"admin token: {report.credentials_path}")
    if os.environ.get("PAIRREG_EMBEDDED_WORKER", "1") != "0":
        # Measurement jobs run in this process unless a separate `pairreg worker` is used.
        from cli.worker import start_background_worker

        start_background_worker(settings)
        console.print("background worker: on (PAIRREG_EMBEDDED_WORKER=0 turns it off)")
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
