"""Top-level housekeeping commands: ``init`` and ``db``."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.render import console, print_json
from registry import db
from registry.services.system import initialise
from registry.settings import get_settings

db_app = typer.Typer(help="Database schema.", no_args_is_help=True)


def init(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Create the home, upgrade the schema, make the signing key and first admin token."""
    report = initialise(get_settings())
    if json_out:
        print_json({k: str(v) if isinstance(v, Path) else v for k, v in vars(report).items()})
        return
    console.print(f"home:        {report.home}")
    console.print(f"database:    {report.database_url}")
    console.print(
        f"schema:      {report.schema_revision} ({'upgraded' if report.upgraded else 'current'})"
    )
    if report.admin_token_created:
        console.print(f"admin token: written to {report.credentials_path} (mode 0600)")
    else:
        console.print(f"admin token: already exists (see {report.credentials_path})")
    console.print(f"audit key:   public key at {report.public_key_path}")


JSON = typer.Option(False, "--json", help="Machine-readable output.")


@db_app.command("upgrade")
def db_upgrade(
    revision: str = typer.Argument("head", help="Target revision."), json_out: bool = JSON
) -> None:
    """Migrate the database schema to the code's head revision."""
    url = get_settings().db_url
    before = db.current_revision(url)
    db.upgrade(url, revision)
    after = db.current_revision(url)
    if json_out:
        print_json({"database_url": url, "before": before, "after": after})
        return
    console.print(f"schema: {before or 'empty'} -> {after}")


@db_app.command("current")
def db_current(json_out: bool = JSON) -> None:
    """Show the database's schema revision and the code's head."""
    url = get_settings().db_url
    current, head = db.current_revision(url), db.head_revision()
    if json_out:
        print_json(
            {"database_url": url, "current": current, "head": head, "up_to_date": current == head}
        )
        return
    console.print(f"database: {current or 'empty'}; code head: {head}")


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.add_typer(db_app, name="db")
