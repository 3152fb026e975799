"""``pairreg pair …``: parse, call one service, render."""

from __future__ import annotations

from typing import cast

import typer

from cli.backend import get_backend
from cli.render import console, kv, print_json, short, table
from registry.governance.lifecycle import PairStatus
from registry.methods import METHODS, Method
from registry.records.core import PairRecord
from registry.services.pairs import parse_set_options

app = typer.Typer(no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Machine-readable output.")


def lossy_label(pair: PairRecord) -> str:
    return f"LOSSY ({pair.config.get('acceptance')})" if pair.lossy else "lossless"


def show_pair(pair: PairRecord) -> None:
    kv(
        f"pair {pair.id}",
        [
            ("pair digest", pair.pair_digest),
            ("status", pair.status),
            ("target", f"{pair.target.ref} ({short(pair.target.manifest_digest)})"),
            (
                "drafter",
                f"{pair.drafter.ref} ({short(pair.drafter.manifest_digest)})"
                if pair.drafter
                else "none",
            ),
            ("method", f"{pair.method}, k={pair.k}"),
            ("acceptance", lossy_label(pair)),
            ("config", pair.config),
            ("warnings", "; ".join(pair.warnings) or "none"),
            ("registered", f"{pair.registered_at:%Y-%m-%d %H:%M:%S} by {pair.registered_by}"),
        ],
    )


@app.command("register")
def register(
    target: str = typer.Option(..., "--target", help="Target artifact reference."),
    draft: str | None = typer.Option(None, "--draft", help="Drafter artifact (draft or heads)."),
    method: str = typer.Option(..., "--method", help="|".join(METHODS)),
    k: int = typer.Option(..., "--k", help="num_speculative_tokens."),
    set_: list[str] = typer.Option([], "--set", help="Config key=value (repeatable)."),
    strict: bool = typer.Option(False, "--strict", help="Treat compatibility warnings as errors."),
    json_out: bool = JSON,
) -> None:
    """Register a pair; the same target, drafter and config return the existing pair."""
    result = get_backend().register_pair(
        target=target,
        draft=draft,
        method=cast(Method, method),  # the backend checks it against the contract
        k=k,
        options=parse_set_options(set_),
        strict=strict,
    )
    if json_out:
        print_json(result)
        return
    p = result.pair
    verb = "registered" if result.created else "already registered as"
    console.print(f"{verb} pair {p.id} digest {p.pair_digest} [{lossy_label(p)}]")
    for warning in p.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


@app.command("propose")
def propose(
    draft: str = typer.Argument(..., help="A speculators-format drafter (artifact reference)."),
    target: str | None = typer.Option(None, "--target", help="Check against this target."),
    json_out: bool = JSON,
) -> None:
    """The pair a speculators drafter implies (algorithm, tokens, verifier), checked."""
    p = get_backend().propose_pair(draft=draft, target=target)
    if json_out:
        print_json(p)
        return
    kv(
        f"proposal for {p.drafter.ref}",
        [
            ("target", p.target.ref if p.target else "none chosen"),
            ("candidates", ", ".join(p.candidates) or "-"),
            ("method / k", f"{p.method} / {p.k}"),
            ("options", p.options),
            ("verifier", p.verifier),
            ("errors", "; ".join(p.errors) or "none"),
            ("warnings", "; ".join(p.warnings) or "none"),
            ("registrable", p.registrable),
        ],
    )


@app.command("show")
def show(
    ref: str = typer.Argument(..., help="Pair id or digest prefix."), json_out: bool = JSON
) -> None:
    """Show one pair."""
    pair = get_backend().get_pair(ref=ref)
    if json_out:
        print_json(pair)
    else:
        show_pair(pair)


@app.command("list")
def list_(
    target: str | None = typer.Option(None, help="Only pairs with this target."),
    status: str | None = typer.Option(None, help="Only pairs in this status."),
    method: str | None = typer.Option(None, help="Only this method."),
    limit: int = typer.Option(100, help="Page size."),
    cursor: str | None = typer.Option(None, help="Cursor from a previous page."),
    json_out: bool = JSON,
) -> None:
    """List pairs."""
    page = get_backend().list_pairs(
        target=target,
        status=cast(PairStatus | None, status),
        method=cast(Method | None, method),
        limit=limit,
        cursor=cursor,
    )
    if json_out:
        print_json(page)
        return
    table(
        "pairs",
        ["id", "digest", "status", "target", "drafter", "method", "k", "acceptance", "warnings"],
        [
            (
                p.id,
                short(p.pair_digest),
                p.status,
                p.target.ref,
                p.drafter.ref if p.drafter else "-",
                p.method,
                p.k,
                lossy_label(p),
                len(p.warnings),
            )
            for p in page.items
        ],
    )
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


def _withdraw(verb: str, ref: str, reason: str, json_out: bool) -> None:
    backend = get_backend()
    op = backend.deprecate_pair if verb == "deprecate" else backend.retire_pair
    pair = op(ref=ref, reason=reason)
    if json_out:
        print_json(pair)
        return
    console.print(f"pair {pair.pair_digest[:12]} is now {pair.status}")


@app.command("deprecate")
def deprecate(
    ref: str = typer.Argument(..., help="Pair id or digest prefix."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded in the audit log)."),
    json_out: bool = JSON,
) -> None:
    """Deprecate a pair: it stays on record but can no longer be promoted."""
    _withdraw("deprecate", ref, reason, json_out)


@app.command("retire")
def retire(
    ref: str = typer.Argument(..., help="Pair id or digest prefix."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded in the audit log)."),
    json_out: bool = JSON,
) -> None:
    """Retire a pair for good (it must not be live anywhere)."""
    _withdraw("retire", ref, reason, json_out)
