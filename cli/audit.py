"""``pairreg audit …``: the audit log's events, proofs, verification and signed checkpoints."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import typer

from cli.backend import get_backend
from cli.render import console, print_json, table
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
        ["seq", "time", "actor", "action", "entity"],
        [
            (
                e.seq,
                f"{e.occurred_at:%Y-%m-%d %H:%M:%S}",
                e.actor,
                e.action,
                f"{e.entity_type}:{e.entity_id}",
            )
            for e in page.items
        ],
    )
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


# --- the transparency log (docs/transparency.md) ------------------------------------------


@app.command("prove")
def prove(
    event: int = typer.Option(..., "--event", help="Audit event sequence number."),
    tree_size: int | None = typer.Option(
        None, "--tree-size", help="Prove against the tree of this many events (default: now)."
    ),
    json_out: bool = JSON,
) -> None:
    """Inclusion proof of one event in the log's Merkle tree (RFC 9162)."""
    p = get_backend().prove_inclusion(seq=event, tree_size=tree_size)
    if json_out:
        print_json(p)
        return
    console.print(
        f"event {p.seq} ({p.event['action']}) is leaf {p.leaf_index} of {p.tree_size}: "
        f"{len(p.path)} hashes to root {p.root_hash}"
    )


@app.command("consistency")
def consistency(
    old: int = typer.Argument(..., help="Older tree size."),
    new: int | None = typer.Argument(None, help="Newer tree size (default: now)."),
    json_out: bool = JSON,
) -> None:
    """Consistency proof that the tree of NEW events extends the tree of OLD (RFC 9162)."""
    p = get_backend().prove_consistency(old_size=old, new_size=new)
    if json_out:
        print_json(p)
        return
    console.print(
        f"{p.old_size} → {p.new_size}: {len(p.path)} hashes; roots {p.old_root} → {p.new_root}"
    )


@app.command("checkpoint")
def checkpoint(
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the note here."),
    json_out: bool = JSON,
) -> None:
    """Sign a C2SP checkpoint of the log (refused if it does not extend the last one)."""
    cp = get_backend().sign_log_checkpoint()
    if json_out:
        print_json(cp)
    elif output:
        output.write_text(cp.note)
        console.print(f"checkpoint of {cp.tree_size} events written to {output}")
        console.print(f"log verifier key: {cp.verifier_key}")
    else:
        print(cp.note, end="")


@app.command("verify")
def verify(
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="A C2SP checkpoint note the log must extend."
    ),
    witness_key: list[str] = typer.Option(
        [], "--witness-key", help="A witness's verifier key whose cosignature the note must carry."
    ),
    incremental: bool = typer.Option(
        False,
        "--incremental",
        help="Recompute only the events since the checkpoint the last run verified.",
    ),
    json_out: bool = JSON,
) -> None:
    """Recompute the Merkle tree from every event and compare it with every checkpoint the
    log signed; exit 1 on any difference."""
    note = None
    if checkpoint is not None:
        try:
            note = checkpoint.read_text()
        except OSError as exc:
            raise InvalidInput(f"--checkpoint {checkpoint}: {exc}", field="checkpoint") from exc
    r = get_backend().verify_audit_log(
        checkpoint=note, witness_keys=witness_key or None, incremental=incremental
    )
    if json_out:
        print_json(r)
    elif r.first_bad_seq is not None or r.reason:
        console.print(f"BROKEN at sequence {r.first_bad_seq}: {r.reason}")
    else:
        since = f" (events after {r.verified_from} recomputed)" if r.verified_from else ""
        console.print(f"log intact: {r.tree_size} events, root {r.root_hash}{since}")
    if not json_out:
        _print_signed(r.signed_ok, r.signed_detail)
    if r.checkpoint_ok is not None and not json_out:
        console.print(f"checkpoint {'ok' if r.checkpoint_ok else 'FAILED'}: {r.checkpoint_detail}")
    if not r.ok:
        raise typer.Exit(1)


def _print_signed(ok: bool | None, detail: str | None) -> None:
    """The comparison with the checkpoints the log signed (absent when the log itself broke)."""
    if ok is not None:
        console.print(f"signed checkpoints {'ok' if ok else 'DIVERGED'}: {detail}", highlight=False)


@app.command("witness")
def witness(
    checkpoint: Path | None = typer.Argument(
        None, help="Checkpoint note to co-sign (default: fetch the log's newest)."
    ),
    name: str = typer.Option(..., "--name", help="This witness's key name, e.g. w.example/1."),
    key: Path = typer.Option(..., "--key", help="Its Ed25519 key (PEM; created if missing)."),
    state: Path = typer.Option(..., "--state", help="Its state file (last checkpoint seen)."),
    log_key: str = typer.Option(
        ..., "--log-key", help="The log's verifier key (name+keyid+base64), obtained out of band."
    ),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the cosigned note."),
) -> None:
    """Co-sign the log's checkpoint after verifying it extends the last one this witness saw.

    Exit 1, loudly, on a fork: a checkpoint no consistency proof joins to the last one."""
    from cli.render import err_console
    from registry.trust.witness import ForkDetected, Witness

    backend = get_backend()
    w = Witness(name=name, key_path=key, state_path=state, log_key=log_key)
    if checkpoint is not None:
        try:
            note = checkpoint.read_text()
        except OSError as exc:
            raise InvalidInput(f"checkpoint {checkpoint}: {exc}", field="checkpoint") from exc
    else:
        note = backend.get_log_checkpoint().note

    def proof(old: int, new: int) -> list[bytes]:
        return [
            bytes.fromhex(h) for h in backend.prove_consistency(old_size=old, new_size=new).path
        ]

    try:
        result = w.cosign(note, proof)
    except ForkDetected as exc:
        err_console.print(f"[bold red]{exc}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from exc
    if output:
        output.write_text(result.note)
    else:
        print(result.note, end="")
    err_console.print(result.detail, highlight=False)
    err_console.print(f"witness verifier key: {w.verifier.vkey}", highlight=False)
