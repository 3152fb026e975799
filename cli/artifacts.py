"""``pairreg artifact …``: parse, call one service, render."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from cli.backend import get_backend, user_path
from cli.render import console, kv, print_json, short, table
from registry.errors import InvalidInput
from registry.records.core import ArtifactRecord, Provenance, Role, SignatureIn

app = typer.Typer(no_args_is_help=True)

JSON = typer.Option(False, "--json", help="Machine-readable output.")


def _parse_attestations(items: list[str]) -> dict[str, str]:
    from registry.errors import InvalidInput

    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise InvalidInput(f"--attestation {item!r}: expected key=value", field="attestation")
        key, value = item.split("=", 1)
        out[key] = value
    return out


def show_artifact(art: ArtifactRecord) -> None:
    kv(
        f"artifact {art.ref}",
        [
            ("id", art.id),
            ("role", art.role),
            ("source", art.source),
            ("hub commit", art.hub_commit),
            ("manifest digest", art.manifest_digest),
            ("signing root", art.signing_root),
            ("files / bytes", f"{art.file_count} / {art.total_size}"),
            ("tokenizer digest", art.tokenizer_digest),
            ("vocab digest", f"{short(art.vocab_digest)} ({art.vocab_size} tokens)"),
            ("facts", art.facts),
            ("provenance", art.provenance.model_dump(exclude_none=True)),
            ("provenance missing", ", ".join(art.provenance_missing) or "nothing"),
            ("signature", _signature_line(art.signature)),
            ("registered", f"{art.registered_at:%Y-%m-%d %H:%M:%S} by {art.registered_by}"),
        ],
    )


def _signature_line(sig: dict | None) -> str:
    if not sig:
        return "unsigned"
    line = f"{sig['kind']} signature by {sig['signer']}, subject {short(sig['subject_digest'])}"
    if sig.get("root_fingerprint"):
        line += f", CA {short(sig['root_fingerprint'].removeprefix('sha256:'))}"
    return line


def _read(path: Path | None, option: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except OSError as exc:
        raise InvalidInput(f"{option} {path}: {exc}", field=option.lstrip("-")) from exc


@app.command("add")
def add(
    source: str = typer.Argument(..., help="Local directory or hf://org/repo[@revision]."),
    name: str = typer.Option(..., "--name", help="Lineage name, e.g. acme/chat-8b."),
    role: str = typer.Option(..., "--role", help="target, draft or heads."),
    publisher: str | None = typer.Option(None, help="Who published the weights."),
    license: str | None = typer.Option(None, "--license", help="License identifier."),
    source_url: str | None = typer.Option(None, help="Where the weights came from."),
    training_data: str | None = typer.Option(None, help="Training data description."),
    base_model: str | None = typer.Option(None, help="Model this was derived from."),
    trained_against: str | None = typer.Option(
        None, help="Artifact ref or manifest digest of the target it was trained for."
    ),
    training_code_revision: str | None = typer.Option(None, help="Training code commit."),
    attestation: list[str] = typer.Option([], help="key=value attestation (repeatable)."),
    signature: Path | None = typer.Option(
        None,
        help="OpenSSF model signature to verify (default with --signer-key/--ca: "
        "model.sig in the source directory).",
    ),
    signer_key: Path | None = typer.Option(None, help="PEM public key of a key signature."),
    ca: list[Path] = typer.Option(
        [], help="PEM CA certificate(s) of a certificate signature (repeatable)."
    ),
    policy: str | None = typer.Option(
        None, help="Apply this policy's signature rules at registration."
    ),
    json_out: bool = JSON,
) -> None:
    """Hash and register an artifact; identical content returns the existing record."""
    provenance = Provenance(
        publisher=publisher,
        license=license,
        source_url=source_url,
        training_data=training_data,
        base_model=base_model,
        trained_against=trained_against,
        training_code_revision=training_code_revision,
        attestations=_parse_attestations(attestation),
    )
    sig = None
    if signature is not None or signer_key is not None or ca:
        sig = SignatureIn(
            path=str(signature.expanduser().resolve()) if signature else None,
            public_key=_read(signer_key, "--signer-key"),
            certificate_chain=[t for t in (_read(c, "--ca") for c in ca) if t],
        )
    with console.status("hashing…"):
        result = get_backend().add_artifact(
            source=user_path(source), name=name, role=cast(Role, role), provenance=provenance,
            signature=sig, policy=policy,
        )  # fmt: skip
    if json_out:
        print_json(result)
        return
    art = result.artifact
    verb = "registered" if result.created else "already registered as"
    console.print(f"{verb} {art.ref} (id {art.id}, manifest {short(art.manifest_digest)})")
    if result.target_changed:
        console.print(f"[yellow]target changed:[/] {art.lineage} has a new version v{art.version}")
    if art.provenance_missing:
        console.print(f"provenance missing: {', '.join(art.provenance_missing)}")
    if art.signature:
        console.print(_signature_line(art.signature))


@app.command("show")
def show(ref: str = typer.Argument(..., help="Artifact reference."), json_out: bool = JSON) -> None:
    """Show one artifact with its manifest."""
    art = get_backend().get_artifact(ref=ref)
    if json_out:
        print_json(art)
        return
    show_artifact(art)
    table(
        "manifest",
        ["path", "size", "sha256"],
        [(e.path, e.size, e.sha256) for e in art.manifest or []],
    )


@app.command("approve-remote-code")
def approve_remote_code(
    ref: str = typer.Argument(..., help="Artifact reference (lineage@vN or id)."),
    reason: str = typer.Option(..., "--reason", help="Why these bytes may run (recorded)."),
    json_out: bool = JSON,
) -> None:
    """Approve one artifact's own model code to run in isolated workers (admin).

    The approval is for these exact bytes (manifest digest): a new version needs its own."""
    out = get_backend().approve_remote_code(ref=ref, reason=reason)
    if json_out:
        print_json(out)
        return
    what = "approved" if out.created else "already approved"
    console.print(f"{ref}: model code {what} (manifest {short(out.manifest_digest)})")


@app.command("list")
def list_(
    lineage: str | None = typer.Option(None, help="Only this lineage."),
    role: str | None = typer.Option(None, help="Only this role."),
    limit: int = typer.Option(100, help="Page size."),
    cursor: str | None = typer.Option(None, help="Cursor from a previous page."),
    json_out: bool = JSON,
) -> None:
    """List artifacts."""
    page = get_backend().list_artifacts(
        lineage=lineage, role=cast(Role | None, role), limit=limit, cursor=cursor
    )
    if json_out:
        print_json(page)
        return
    table(
        "artifacts",
        ["id", "ref", "role", "manifest", "files", "source", "missing provenance"],
        [
            (
                a.id,
                a.ref,
                a.role,
                short(a.manifest_digest),
                a.file_count,
                a.source,
                len(a.provenance_missing),
            )
            for a in page.items
        ],
    )
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


@app.command("verify")
def verify(
    ref: str = typer.Argument(..., help="Artifact reference."),
    path: Path | None = typer.Option(None, "--path", help="Directory to check (default: source)."),
    json_out: bool = JSON,
) -> None:
    """Re-hash files against the manifest; exit 1 on any difference."""
    report = get_backend().verify_artifact(ref=ref, path=user_path(str(path)) if path else None)
    if json_out:
        print_json(report)
    else:
        if report.ok:
            console.print(f"ok: {report.path} matches manifest {short(report.manifest_digest)}")
        else:
            rows = [("changed", p) for p in report.changed]
            rows += [("missing", p) for p in report.missing]
            rows += [("added", p) for p in report.added]
            table(f"differences in {report.path}", ["kind", "path"], rows)
    if not report.ok:
        raise typer.Exit(1)
