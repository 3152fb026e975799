"""``pairreg serve``: initialise the embedded registry if needed and run the API."""

from __future__ import annotations

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
    console.print(f"pairreg API on http://{host}:{port}  (docs: http://{host}:{port}/docs)")
    console.print(f"database: {report.database_url}")
    console.print(f"admin token: {report.credentials_path}")
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
