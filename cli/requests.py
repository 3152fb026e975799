"""Request tagging, serving integrations and audit reconstruction commands.

Adds ``pairreg export``, ``pairreg proxy``, ``pairreg telemetry``, ``pairreg requests`` and,
on the ``audit`` sub-app, ``request``, ``requests``, ``bundle``, ``verify-bundle`` and
``fetch-weights``. ``verify-bundle`` never touches a database or a server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, cast

import typer
from rich.markup import escape

from cli.audit import _time
from cli.audit import app as audit_app
from cli.backend import get_backend
from cli.render import console, kv, print_json, short, styled, table
from registry.errors import InvalidInput

JSON = typer.Option(False, "--json", help="Machine-readable output.")

export_app = typer.Typer(no_args_is_help=True, help="Serving-engine launch arguments.")
telemetry_app = typer.Typer(no_args_is_help=True, help="Serving telemetry (vLLM metrics).")
requests_app = typer.Typer(
    no_args_is_help=True, help="Request tags: ingest, partitions, retention, archives."
)


PUBLIC_KEY = typer.Option(
    None, "--public-key", help="The registry's audit public key you trust (PEM), out of band."
)
TRUST_FILE = typer.Option(
    None,
    "--trust-file",
    help="A file of trusted keys (PEM public keys and/or name+keyid+base64 verifier keys).",
)


def read_trusted(public_key: Path | None, trust_file: Path | None) -> str | None:
    """The pinned key text: the PEM key, the trust file, or both concatenated."""
    parts = []
    for path, flag in ((public_key, "public_key"), (trust_file, "trust_file")):
        if path is not None:
            try:
                parts.append(path.read_text())
            except OSError as exc:
                raise InvalidInput(f"--{flag.replace('_', '-')} {path}: {exc}", field=flag) from exc
    return "\n".join(parts) if parts else None


# --- export -----------------------------------------------------------------------------


def _export(
    engine: str,
    deployment: str,
    json_out: bool,
    hardware: str | None = None,
    context: int = 4096,
    max_batch: int | None = None,
) -> None:
    result = get_backend().export_serving(
        deployment=deployment,
        engine=cast(Literal["vllm", "sglang"], engine),
        hardware=hardware,
        context=context,
        max_batch=max_batch,
    )
    if json_out:
        print_json(result)
        return
    print(result.command)
    if result.k_schedule is not None:
        from cli.economics import show_k_schedule

        show_k_schedule(result.k_schedule, err=True)


HARDWARE = typer.Option(
    None,
    "--hardware",
    help="Hardware profile: add the draft length per batch size that maximises predicted "
    "throughput there (the prediction goes to stderr).",
)
CONTEXT = typer.Option(4096, "--context", help="Tokens per sequence, for the schedule.")
MAX_BATCH = typer.Option(None, "--max-batch", help="Largest batch size to schedule.")


@export_app.command("vllm")
def export_vllm(
    deployment: str = typer.Argument(..., help="Deployment whose live pair to serve."),
    json_out: bool = JSON,
    hardware: str | None = HARDWARE,
    context: int = CONTEXT,
    max_batch: int | None = MAX_BATCH,
) -> None:
    """vLLM launch arguments: --model/--revision pinned, --speculative-config JSON (with
    num_speculative_tokens_per_batch_size when --hardware is given)."""
    _export("vllm", deployment, json_out, hardware, context, max_batch)


@export_app.command("sglang")
def export_sglang(
    deployment: str = typer.Argument(..., help="Deployment whose live pair to serve."),
    json_out: bool = JSON,
    hardware: str | None = HARDWARE,
    context: int = CONTEXT,
    max_batch: int | None = MAX_BATCH,
) -> None:
    """SGLang launch flags with the draft model's revision pinned (SGLang takes no
    per-batch-size draft length; --hardware reports the schedule only)."""
    _export("sglang", deployment, json_out, hardware, context, max_batch)


@export_app.command("speculators")
def export_speculators(
    pair: str = typer.Argument(..., help="Pair id or digest prefix (its drafter is exported)."),
    out_dir: Path = typer.Argument(..., help="Directory to write config.json and weights to."),
    json_out: bool = JSON,
) -> None:
    """The drafter in the speculators format, its verifier pinned to the target's Hub commit
    and manifest digest (added fields vLLM ignores and pairreg reads back)."""
    from registry.flows import write_speculators_export
    from registry.settings import get_settings

    export, written = write_speculators_export(
        get_backend(),
        pair=pair,
        out_dir=out_dir,
        state_dir=get_settings().cache_dir / "verified",
    )
    if json_out:
        print_json({"export": export.model_dump(mode="json"), "written": written})
        return
    console.print(
        f"wrote {len(written)} files to {out_dir} (verifier pinned to {export.target_ref})"
    )


# --- telemetry --------------------------------------------------------------------------


def _show_telemetry(result: Any, json_out: bool) -> None:
    if json_out:
        print_json(result)
        return
    rate = "n/a" if result.online_acceptance is None else f"{result.online_acceptance:.4f}"
    base = "n/a" if result.baseline_acceptance is None else f"{result.baseline_acceptance:.4f}"
    console.print(
        f"{result.deployment}: pair {short(result.pair_digest)} online acceptance {rate} over "
        f"{result.window_drafted} draft tokens (baseline {base}, margin {result.margin})"
        + (" [counters reset]" if result.reset else "")
    )
    if result.flagged:
        console.print(f"[red]workload drift flag {result.flag_id} open[/]")
    serving = getattr(result, "serving", None)
    if serving is not None and serving.differences:
        for d in serving.differences:
            console.print(f"[red]served {d.field}: expected {d.expected}, reported {d.reported}[/]")
        console.print(f"[red]serving flag {serving.flag_id} open[/]")
        if serving.remeasure_job_id:
            console.print(f"re-measurement queued: job {serving.remeasure_job_id}")


@telemetry_app.command("scrape")
def telemetry_scrape(
    url: str = typer.Argument(..., help="The engine's /metrics URL."),
    deployment: str = typer.Option(..., "--deployment", help="The deployment it serves."),
    min_drafted: int = typer.Option(1000, help="Draft tokens needed before flagging."),
    json_out: bool = JSON,
) -> None:
    """Scrape vLLM's Prometheus metrics once and store the spec-decode counter deltas; also
    read what the engine reports about itself (/v1/models, /version, beside /metrics) so the
    registry checks it serves the deployment's live pair."""
    import httpx

    from registry.services.serving import card_fields

    try:
        resp = httpx.get(url, timeout=30)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise InvalidInput(f"cannot scrape {url}: {exc}", field="url") from exc
    base = url.rstrip("/").removesuffix("/metrics")
    report: dict[str, Any] = {}
    try:  # an engine that does not say is only not checked
        models = httpx.get(f"{base}/v1/models", timeout=30)
        if models.status_code == 200:
            report.update(card_fields(models.json(), deployment))
        version = httpx.get(f"{base}/version", timeout=30)
        if version.status_code == 200 and version.json().get("version"):
            report["engine_version"] = str(version.json()["version"])
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    result = get_backend().ingest_prometheus(
        deployment=deployment, text=resp.text, source=url, min_drafted=min_drafted, **report
    )
    _show_telemetry(result, json_out)


@telemetry_app.command("push")
def telemetry_push(
    file: Path = typer.Argument(..., help="A saved Prometheus text exposition."),
    deployment: str = typer.Option(..., "--deployment"),
    min_drafted: int = typer.Option(1000, help="Draft tokens needed before flagging."),
    json_out: bool = JSON,
) -> None:
    """Store a saved scrape (same as ``scrape``, from a file)."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise InvalidInput(f"{file}: {exc}", field="file") from exc
    result = get_backend().ingest_prometheus(
        deployment=deployment, text=text, source=str(file), min_drafted=min_drafted
    )
    _show_telemetry(result, json_out)


# --- requests ---------------------------------------------------------------------------


@requests_app.command("ingest")
def requests_ingest(
    file: Path = typer.Argument(..., help="JSON Lines, one tag per line."),
    batch: int = typer.Option(5000, help="Tags per call (at most 10000)."),
    json_out: bool = JSON,
) -> None:
    """Ingest tags from a file (idempotent: re-running it changes nothing). Tags whose id
    already holds a different tag are listed (by line) and not stored; the rest are, and the
    exit code is then 1."""
    if not 1 <= batch <= 10_000:
        raise InvalidInput("--batch must be 1..10000", field="batch")
    try:
        numbered = [(n, ln) for n, ln in enumerate(file.read_text().splitlines(), 1) if ln.strip()]
        tags = [json.loads(ln) for _, ln in numbered]
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{file}: {exc}", field="file") from exc
    backend = get_backend()
    totals = {"received": 0, "stored": 0, "duplicates": 0, "conflicted": 0, "inconsistent": 0}
    conflicts: list[dict[str, Any]] = []
    for i in range(0, len(tags), batch):
        result = backend.ingest_requests(tags=tags[i : i + batch])
        for key in totals:
            totals[key] += getattr(result, key)
        conflicts += [
            {"line": numbered[i + c.index][0], "request_id": c.request_id, "reason": c.reason}
            for c in result.conflicts
        ]
    if json_out:
        print_json({**totals, "conflicts": conflicts})
    else:
        console.print(", ".join(f"{k} {v}" for k, v in totals.items()))
        for c in conflicts:
            console.print(
                f"not stored: line {c['line']}: request id {escape(c['request_id'])} "
                + ("already holds a different tag" if c["reason"] == "recorded"
                   else "appears earlier in the batch with other content"),
                highlight=False,
            )  # fmt: skip
    if conflicts:
        raise typer.Exit(1)


@requests_app.command("partitions")
def requests_partitions(
    ahead: int = typer.Option(3, help="Months ahead to create."),
    json_out: bool = JSON,
) -> None:
    """PostgreSQL: create the monthly tag partitions for the coming months (run monthly)."""
    result = get_backend().maintain_partitions(ahead=ahead)
    if json_out:
        print_json(result)
        return
    console.print(result["detail"])


@requests_app.command("retention")
def requests_retention(
    kind: str = typer.Option("request_tags", help="request_tags or audit_events."),
    set_months: int | None = typer.Option(
        None, "--set", help="Keep records this many months (at least 6); audited."
    ),
    json_out: bool = JSON,
) -> None:
    """How long records are kept before anything may delete them (at least six months)."""
    b = get_backend()
    rec = (
        b.set_retention(kind=kind, months=set_months)  # type: ignore[arg-type]
        if set_months is not None
        else b.get_retention(kind=kind)  # type: ignore[arg-type]
    )
    if json_out:
        print_json(rec)
        return
    console.print(
        f"{rec.kind}: kept {rec.months} months; records before "
        f"{rec.horizon:%Y-%m-%d} may be archived and dropped"
    )


@requests_app.command("archive")
def requests_archive(
    before: str = typer.Option(
        ..., "--before", help="Archive whole batches served before this date."
    ),
    to: Path = typer.Option(..., "--to", help="A new or empty directory for the archive."),
    purge: bool = typer.Option(
        False, "--purge", help="After verifying it, delete the archived rows (past retention)."
    ),
    json_out: bool = JSON,
) -> None:
    """Write request tags to a verifiable archive (JSONL + manifest); optionally purge."""
    from datetime import date

    try:
        day = date.fromisoformat(before)
    except ValueError as exc:
        raise InvalidInput(
            f"--before {before!r} is not a date (YYYY-MM-DD)", field="before"
        ) from exc
    with console.status("archiving…"):
        r = get_backend().archive_requests(
            before=day, directory=str(to.expanduser().resolve()), purge=purge
        )
    if json_out:
        print_json(r)
        return
    console.print(
        f"archived {r.requests} request(s) in {r.batches} batch(es) to {r.directory} "
        f"(root {short(r.manifest['merkle_root'])}, manifest {short(r.manifest_sha256)}); "
        + (f"purged, dropped {r.dropped_partitions or 'no partitions'}" if r.purged else "kept")
    )


@requests_app.command("archived")
def requests_archived(
    directory: Path = typer.Argument(..., help="An archive written by `requests archive`."),
    request_id: str = typer.Argument(..., help="The request to reconstruct."),
    public_key: Path | None = PUBLIC_KEY,
    trust_file: Path | None = TRUST_FILE,
    json_out: bool = JSON,
) -> None:
    """Reconstruct an archived request from its archive (verifying the archive first,
    against the key you pin, or else the registry's own log key)."""
    r = get_backend().get_archived_request(
        directory=str(directory.expanduser()),
        request_id=request_id,
        trusted_key=read_trusted(public_key, trust_file),
    )
    if json_out:
        print_json(r)
    else:
        kv(
            f"archived request {request_id}",
            [
                ("tag", r["tag"]),
                ("tag digest", r["tag_digest"]),
                ("batch", f"{r['batch']['batch_id']} (audit event {r['batch']['audit_seq']})"),
                ("pair", (r.get("pair") or {}).get("pair_digest")),
                (
                    "archive",
                    {"verified": "verified", "unpinned": "UNPINNED: not verified"}.get(
                        r.get("verdict", ""), "FAILED"
                    ),
                ),
            ],
        )
        for c in r["checks"]:
            if not c["ok"]:
                console.print(f"FAILED {c['name']}: {c['detail']}")
    if not r["ok"]:
        raise typer.Exit(1)


# --- audit ------------------------------------------------------------------------------


def _show_audit(a: Any) -> None:
    t = a.tag
    pair = a.pair
    drafter = pair.get("drafter")
    state = (
        "consistent" if t.consistent else styled("[red]INCONSISTENT[/] (pair was not live then)")
    )
    rows: list[tuple[str, Any]] = [
        ("request", t.request_id),
        ("source", t.source or "(before sources)"),
        ("served at", t.served_at.isoformat()),
        ("deployment", t.deployment),
        ("pair digest", t.pair_digest + (" (filled in by the registry)" if t.pair_filled else "")),
        ("consistency", state),
        ("tokens", f"{t.input_tokens} in, {t.output_tokens} out"),
        ("spec counters", t.spec or "none"),
        ("tag digest", t.tag_digest),
        ("target", f"{pair['target']['ref']} {pair['target']['source']}"),
        ("target manifest", pair["target"]["manifest_digest"]),
        (
            "drafter",
            f"{drafter['ref']} {drafter['source']}" if drafter else "none",
        ),
        ("config", pair["config"]),
    ]
    if a.deployment_event:
        ev = a.deployment_event
        rows.append(("made live by", f"{ev['action']} #{ev['seq']} at {ev['at']} by {ev['actor']}"))
    else:
        rows.append(("live then", a.live_pair_digest or "no pair"))
    v = a.validation
    rows.append(
        (
            "validation",
            f"#{v['id']} policy {v['policy_name']} passed={v['passed']}" if v else "none recorded",
        )
    )
    rows.append(
        (
            "open flags",
            ", ".join(f"#{f['id']} {f['kind']} {f['severity']}" for f in a.open_flags) or "none",
        )
    )
    rows.append(("ingest batch", f"#{a.batch['id']} audit event {a.batch['audit_seq']}"))
    kv(f"request {t.request_id}", rows)


SOURCE = typer.Option(
    None,
    "--source",
    help="Who sent the id (a tag's source, e.g. token:proxy-a); needed only when two "
    "sources sent the same id.",
)


@audit_app.command("request")
def audit_request(
    request_id: str = typer.Argument(..., help="The request id the serving stack used."),
    source: str | None = SOURCE,
    json_out: bool = JSON,
) -> None:
    """Which pair served this request, with its artifacts, promotion, validation and flags."""
    answer = get_backend().audit_request(request_id=request_id, source=source)
    if json_out:
        print_json(answer)
        return
    _show_audit(answer)


@audit_app.command("requests")
def audit_requests(
    pair: str | None = typer.Option(None, help="Pair id or digest prefix."),
    deployment: str | None = typer.Option(None, help="Deployment name."),
    since: str | None = typer.Option(None, help="ISO-8601 time with timezone."),
    until: str | None = typer.Option(None, help="ISO-8601 time with timezone."),
    inconsistent: bool = typer.Option(False, "--inconsistent", help="Only inconsistent tags."),
    limit: int = typer.Option(100, help="Page size."),
    cursor: str | None = typer.Option(None, help="Cursor from a previous page."),
    json_out: bool = JSON,
) -> None:
    """List tags, oldest first, with totals over the whole filter."""
    page = get_backend().list_requests(
        pair=pair,
        deployment=deployment,
        since=_time(since, "since"),
        until=_time(until, "until"),
        inconsistent=True if inconsistent else None,
        limit=limit,
        cursor=cursor,
    )
    if json_out:
        print_json(page)
        return
    table(
        "requests",
        ["request", "served at", "deployment", "pair", "in", "out", "consistent"],
        [
            (
                t.request_id,
                f"{t.served_at:%Y-%m-%d %H:%M:%S}",
                t.deployment,
                short(t.pair_digest),
                t.input_tokens,
                t.output_tokens,
                "yes" if t.consistent else "NO",
            )
            for t in page.items
        ],
    )
    c = page.counts
    console.print(
        f"{c.total} tags ({c.inconsistent} inconsistent), "
        f"{c.input_tokens} input / {c.output_tokens} output tokens"
    )
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


@audit_app.command("bundle")
def audit_bundle(
    request_id: str = typer.Argument(...),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the bundle."),
    source: str | None = SOURCE,
) -> None:
    """Write a self-contained, offline-verifiable JSON bundle for one request."""
    bundle = get_backend().build_bundle(request_id=request_id, source=source)
    output.write_text(json.dumps(bundle, indent=1, sort_keys=True) + "\n")
    console.print(
        f"bundle for {request_id} written to {output}: {len(bundle['log']['events'])} audit "
        f"events proven into the log's signed checkpoint of "
        f"{bundle['log']['checkpoint'].splitlines()[1]} events"
    )


def _load_bundle(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{file}: {exc}", field="file") from exc


@audit_app.command("verify-bundle")
def audit_verify_bundle(
    file: Path = typer.Argument(..., help="A bundle from `pairreg audit bundle`."),
    weights: list[str] = typer.Option(
        [], "--weights", help="A weights directory to re-hash ([target=|drafter=]DIR)."
    ),
    public_key: Path | None = PUBLIC_KEY,
    trust_file: Path | None = TRUST_FILE,
    json_out: bool = JSON,
) -> None:
    """Verify a bundle offline (no database, no server) against a key you pinned; exit 1
    with the reason if it fails, or saying UNPINNED when no key was pinned."""
    from registry.trust.bundle_verify import verify_bundle

    trusted = read_trusted(public_key, trust_file)
    report = verify_bundle(_load_bundle(file), weights=weights, trusted_public_key=trusted)
    if json_out:
        print_json(report.to_dict())
    else:
        for check in report.checks:
            mark = "[green]ok[/]  " if check.ok else "[red]FAIL[/]"
            console.print(f"{mark} {escape(check.name)}: {escape(check.detail)}", highlight=False)
        console.print(
            {
                "verified": "bundle VERIFIED",
                "unpinned": "[yellow]bundle UNPINNED: not verified[/] (every other check "
                "passed; pin the log's key with --public-key or --trust-file)",
                "failed": "[red]bundle FAILED verification[/]",
            }[report.verdict]
        )
    if not report.ok:
        raise typer.Exit(1)


@audit_app.command("fetch-weights")
def audit_fetch_weights(
    file: Path = typer.Argument(..., help="A bundle from `pairreg audit bundle`."),
    cache_dir: Path | None = typer.Option(None, help="Hugging Face cache directory."),
    json_out: bool = JSON,
) -> None:
    """Download the exact Hub commits of the bundle's artifacts and re-hash them."""
    from huggingface_hub import snapshot_download

    from registry.artifacts import hub
    from registry.artifacts.manifest import build_manifest, compare_manifests, hub_snapshot_root

    bundle = _load_bundle(file)
    out = []
    for role in ("target", "drafter"):
        art = bundle["pair"].get(role)
        if not art:
            continue
        if not art.get("hub_repo") or not art.get("hub_commit"):
            raise InvalidInput(
                f"{role} {art['ref']} has no Hub commit (source {art['source']})", field=role
            )
        try:
            # Endpoint and cache are read now, not at import (HF_ENDPOINT may point at a mirror).
            path = snapshot_download(
                art["hub_repo"],
                revision=art["hub_commit"],
                cache_dir=str(cache_dir or hub.default_cache_dir()),
                endpoint=hub.default_endpoint(),
            )
        except Exception as exc:  # noqa: BLE001 - the Hub client raises many kinds
            raise InvalidInput(
                f"cannot download {art['hub_repo']}@{art['hub_commit']}: {exc}", field=role
            ) from exc
        snap = Path(path)
        diff = compare_manifests(
            art["manifest"], build_manifest(snap, symlink_root=hub_snapshot_root(snap))
        )
        out.append({"role": role, "path": str(snap), "ok": diff.ok, **diff.to_dict()})
    if json_out:
        print_json(out)
    else:
        for item in out:
            state = "matches its manifest" if item["ok"] else f"DIFFERS: {item}"
            console.print(f"{item['role']}: {item['path']} {state}")
    if not all(item["ok"] for item in out):
        raise typer.Exit(1)


# --- proxy ------------------------------------------------------------------------------


def proxy(
    deployment: str = typer.Option(..., "--deployment", help="The deployment behind the proxy."),
    upstream: str = typer.Option(..., "--upstream", help="OpenAI-compatible server URL."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8100, help="Port to listen on."),
    spool: Path | None = typer.Option(None, help="Tagger spool directory."),
    refresh: float = typer.Option(5.0, help="Seconds between live-pair refreshes."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    provider: str = typer.Option(
        "vllm", "--provider", help="gen_ai.provider.name on the spans (the upstream engine)."
    ),
) -> None:
    """OpenAI-compatible pass-through that tags every request with the live pair.

    OpenTelemetry spans (GenAI conventions) go out when the OTEL_* settings ask for them.
    """
    import uvicorn

    from api.proxy import create_proxy_app
    from registry.settings import get_settings

    settings = get_settings()
    app = create_proxy_app(
        deployment=deployment,
        upstream=upstream,
        settings=settings,
        spool_dir=spool or settings.home_dir / "spool" / f"proxy-{deployment}",
        refresh_s=refresh,
        provider_name=provider,
    )
    console.print(f"pairreg proxy for {deployment} on http://{host}:{port} -> {upstream}")
    uvicorn.run(app, host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
    app.add_typer(telemetry_app, name="telemetry")
    app.add_typer(requests_app, name="requests")
    app.command("proxy")(proxy)
