"""``pairreg audit …``: the audit log's events, chain verification and signed checkpoints."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import typer

from cli.backend import get_backend
from cli.render import console, print_json, short, table
from registry.errors import InvalidInput

app = typer.Typer(no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Machine-readable output.")


def _time(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(f"--{field} {value!r} is not an ISO-8601 time", field=field) from exc
    if parsed.tzinfo is None:
        raise InvalidInput(f"--{field} must include a timezone (e.g. Z)", field=field)
    return parsed


@app.command("events")
def events(
    entity_type: str | None = typer.Option(None, help="artifact, pair, token, …"),
    entity_id: str | None = typer.Option(None, help="Entity id (with --entity-type)."),
    actor: str | None = typer.Option(None, help="Only this actor."),
    action: str | None = typer.Option(None, help="Only this action, e.g. pair.registered."),
    since: str | None = typer.Option(None, help="ISO-8601 time with timezone."),
    until: str | None = typer.Option(None, help="ISO-8601 time with timezone."),
    limit: int = typer.Option(100, help="Page size."),
    cursor: str | None = typer.Option(None, help="Cursor from a previous page."),
    json_out: bool = JSON,
) -> None:
    """List audit events in sequence order."""
    page = get_backend().list_audit_events(
        entity_type=entity_type,
        entity_id=entity_id,
        by_actor=actor,
        action=action,
        since=_time(since, "since"),
        until=_time(until, "until"),
        limit=limit,
        cursor=cursor,
    )
    if json_out:
        print_json(page)
        return
    table(
        "audit events",
        ["seq", "time", "actor", "action", "entity", "chain"],
        [
            (
                e.seq,
                f"{e.occurred_at:%Y-%m-%d %H:%M:%S}",
                e.actor,
                e.action,
                f"{e.entity_type}:{e.entity_id}",
                short(e.chain_hash),
            )
            for e in page.items
        ],
    )
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


@app.command("verify")
def verify(
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="A saved checkpoint the log must still extend."
    ),
    json_out: bool = JSON,
) -> None:
    """Recompute the hash chain; exit 1 naming the first broken sequence number."""
    cp = None
    if checkpoint is not None:
        try:
            cp = json.loads(checkpoint.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"--checkpoint {checkpoint}: {exc}", field="checkpoint") from exc
    result = get_backend().verify_audit_chain(checkpoint=cp)
    if json_out:
        print_json(result)
    elif result.first_broken_seq is not None:
        console.print(f"BROKEN at sequence {result.first_broken_seq}: {result.reason}")
    else:
        console.print(
            f"chain intact: {result.count} events, head {result.head_seq} {result.head_hash}"
        )
    if result.checkpoint_ok is not None and not json_out:
        state = "ok" if result.checkpoint_ok else "FAILED"
        console.print(f"checkpoint {state}: {result.checkpoint_detail}")
    if not result.ok:
        raise typer.Exit(1)


@app.command("checkpoint")
def checkpoint(
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the checkpoint here."),
) -> None:
    """Sign the current head (sequence, chain hash, time) with the Ed25519 audit key."""
    cp = get_backend().create_audit_checkpoint()
    text = json.dumps(cp.model_dump(mode="json"), indent=2, sort_keys=True)
    if output:
        output.write_text(text + "\n")
        console.print(f"checkpoint at sequence {cp.seq} written to {output}")
    else:
        print(text)
