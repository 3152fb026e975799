"""``pairreg webhook …``: outgoing webhook subscriptions (admin), their deliveries, and the
dispatcher that sends them (it also runs inside ``pairreg serve``)."""

from __future__ import annotations

import os
import socket
import time

import typer

from cli.backend import get_backend
from cli.render import console, print_json, table
from registry.integrations.webhooks import Dispatcher
from registry.settings import Settings, get_settings

app = typer.Typer(no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Machine-readable output.")


@app.command("add")
def add(
    name: str = typer.Option(..., "--name", help="Unique name of the subscription."),
    url: str = typer.Option(..., "--url", help="Receiver URL (http or https)."),
    event: list[str] = typer.Option(
        [], "--event", help="Event type to send (repeat); none: every type."
    ),
    deployment: str | None = typer.Option(
        None, "--deployment", help="Only events that concern this deployment."
    ),
    secret: str | None = typer.Option(
        None, "--secret", help="A whsec_ secret to sign with (generated if omitted)."
    ),
    json_out: bool = JSON,
) -> None:
    """Subscribe a receiver; the signing secret is printed once."""
    created = get_backend().create_webhook(
        name=name, url=url, events=event, deployment=deployment, secret=secret
    )
    if json_out:
        print_json(created)
        return
    what = ", ".join(created.webhook.events) or "every event"
    console.print(f"webhook {created.webhook.name} -> {created.webhook.url} ({what}); secret:")
    print(created.secret)


@app.command("list")
def list_(json_out: bool = JSON, limit: int = typer.Option(100), cursor: str | None = None) -> None:
    """List subscriptions with what each is owed."""
    page = get_backend().list_webhooks(limit=limit, cursor=cursor)
    if json_out:
        print_json(page)
        return
    table(
        "webhooks",
        ["name", "url", "events", "deployment", "active", "pending", "delivered"],
        [
            (
                w.name,
                w.url,
                ", ".join(w.events) or "all",
                w.deployment or "all",
                "yes" if w.active else "no",
                str(w.pending),
                str(w.delivered),
            )
            for w in page.items
        ],
    )


@app.command("disable")
def disable(name: str = typer.Argument(...), json_out: bool = JSON) -> None:
    """Stop sending to a receiver (what it is owed is kept)."""
    w = get_backend().disable_webhook(name=name)
    print_json(w) if json_out else console.print(f"webhook {w.name} disabled ({w.pending} owed)")


@app.command("enable")
def enable(name: str = typer.Argument(...), json_out: bool = JSON) -> None:
    """Resume sending, oldest owed event first."""
    w = get_backend().enable_webhook(name=name)
    print_json(w) if json_out else console.print(f"webhook {w.name} enabled ({w.pending} owed)")


@app.command("deliveries")
def deliveries(
    name: str = typer.Argument(...),
    state: str | None = typer.Option(None, help="pending or delivered."),
    json_out: bool = JSON,
    limit: int = typer.Option(100),
    cursor: str | None = None,
) -> None:
    """A receiver's deliveries in order, with attempts and the last answer."""
    page = get_backend().list_webhook_deliveries(name=name, state=state, limit=limit, cursor=cursor)
    if json_out:
        print_json(page)
        return
    table(
        f"deliveries to {name}",
        ["id", "event", "audit seq", "deployments", "state", "attempts", "last answer"],
        [
            (
                d.message_id,
                d.event_type,
                str(d.audit_seq),
                ", ".join(d.deployments) or "-",
                d.state,
                str(d.attempts),
                str(d.last_status or d.last_error or "-"),
            )
            for d in page.items
        ],
    )


def make_dispatcher(settings: Settings, role: str) -> Dispatcher:
    return Dispatcher(
        settings.db_url,
        owner=f"{socket.gethostname()}:{os.getpid()}:{role}"[:100],
        backoff_base=settings.webhook_backoff_base,
        backoff_max=settings.webhook_backoff_max,
        timeout=settings.webhook_timeout,
    )


@app.command("dispatch")
def dispatch(
    interval: float = typer.Option(1.0, help="Seconds between passes over the outbox."),
    once: bool = typer.Option(False, "--once", help="One pass, then exit."),
) -> None:
    """Send what the outbox owes, against the database directly (like `pairreg serve` does)."""
    settings = get_settings()
    disp = make_dispatcher(settings, "dispatch")
    if once:
        rep = disp.run_once()
        console.print(f"delivered {rep.delivered}, failed {rep.failed}")
        return
    stop = disp.start(interval)
    console.print(f"webhook dispatcher on {settings.db_url} (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop.set()
