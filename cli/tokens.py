"""``pairreg token …``: API tokens (admin only when remote)."""

from __future__ import annotations

from typing import cast

import typer

from cli.backend import get_backend
from cli.render import console, print_json, table
from registry.governance.roles import TokenRole

app = typer.Typer(no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Machine-readable output.")


@app.command("create")
def create(
    name: str = typer.Option(..., "--name", help="Token name (unique)."),
    role: str = typer.Option(..., "--role", help="admin|registrar|promoter|ingest|auditor|reader"),
    json_out: bool = JSON,
) -> None:
    """Create a token; its secret is printed once and never stored."""
    created = get_backend().create_token(name=name, role=cast(TokenRole, role))
    if json_out:
        print_json(created)
        return
    console.print(
        f"token {created.token.name} ({created.token.role}) created; secret (shown once):"
    )
    print(created.secret)


@app.command("list")
def list_(json_out: bool = JSON, limit: int = typer.Option(100), cursor: str | None = None) -> None:
    """List tokens (never their secrets)."""
    page = get_backend().list_tokens(limit=limit, cursor=cursor)
    if json_out:
        print_json(page)
        return
    table(
        "tokens",
        ["name", "role", "created by", "created", "last used", "revoked"],
        [
            (
                t.name,
                t.role,
                t.created_by,
                f"{t.created_at:%Y-%m-%d %H:%M}",
                f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "-",
                f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "-",
            )
            for t in page.items
        ],
    )


@app.command("revoke")
def revoke(name: str = typer.Argument(..., help="Token name."), json_out: bool = JSON) -> None:
    """Revoke a token by name."""
    tok = get_backend().revoke_token(name=name)
    if json_out:
        print_json(tok)
    else:
        console.print(f"token {tok.name} revoked at {tok.revoked_at:%Y-%m-%d %H:%M:%S}")


@app.command("whoami")
def whoami(json_out: bool = JSON) -> None:
    """The token in use (remote) or the local user (embedded), its role and capabilities."""
    me = get_backend().whoami()
    if json_out:
        print_json(me)
        return
    who = f"token {me.token}" if me.token else f"{me.actor} (embedded)"
    console.print(f"{who}: role {me.role}")
    console.print(f"may: {', '.join(me.capabilities)}")
