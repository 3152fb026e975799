"""``pairreg curve …`` (acceptance curves out and in) and ``pairreg mlflow …`` (MLflow
registered models followed as lineages, and the deliveries MLflow sent)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cli.backend import get_backend
from cli.render import console, print_json, table
from registry.errors import InvalidInput
from registry.records.lifecycle import AcceptanceCurve

curve_app = typer.Typer(no_args_is_help=True)
mlflow_app = typer.Typer(no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Machine-readable output.")


@curve_app.command("export")
def curve_export(
    pair: str = typer.Argument(..., help="Pair id or digest prefix."),
    measurement: int | None = typer.Option(None, help="Measurement id (default: latest)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write to this file."),
) -> None:
    """Acceptance length per k (1..8) per category with provenance, as JSON."""
    curve = get_backend().export_acceptance_curve(pair=pair, measurement=measurement)
    text = curve.model_dump_json(indent=2)
    if output is None:
        print(text)
    else:
        output.write_text(text + "\n")
        console.print(f"curve of {curve.provenance.pair_digest[:12]} written to {output}")


@curve_app.command("import")
def curve_import(
    path: Path = typer.Argument(..., help="A curve file written by `curve export`."),
    json_out: bool = JSON,
) -> None:
    """Keep a curve for a registered pair (refused when its provenance does not match)."""
    try:
        doc = json.loads(path.read_text())
        curve = AcceptanceCurve.model_validate(doc)
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{path}: not an acceptance curve ({exc})", field="curve") from exc
    res = get_backend().import_acceptance_curve(curve=curve)
    if json_out:
        print_json(res)
        return
    what = "imported" if res.created else "already imported"
    console.print(f"curve {res.digest[:12]} for pair {res.pair_digest[:12]} {what}")


@mlflow_app.command("map")
def mlflow_map(
    registered_model: str = typer.Argument(..., help="MLflow registered model name."),
    lineage: str = typer.Option(..., "--lineage", help="pairreg lineage its versions join."),
    role: str = typer.Option("target", help="target, draft or heads."),
    alias: list[str] = typer.Option(
        [], "--alias", help="Alias whose moves register a version (repeat); none: every version."
    ),
    json_out: bool = JSON,
) -> None:
    """Follow an MLflow registered model (its webhook calls POST /v1/mlflow/webhook)."""
    rec = get_backend().map_mlflow_model(
        registered_model=registered_model, lineage=lineage, role=role, aliases=alias
    )
    if json_out:
        print_json(rec)
        return
    follows = ", ".join(rec.aliases) or "every new version"
    console.print(f"MLflow {rec.registered_model} -> {rec.lineage} ({rec.role}; {follows})")


@mlflow_app.command("list")
def mlflow_list(json_out: bool = JSON) -> None:
    """MLflow registered models followed."""
    page = get_backend().list_mlflow_sources()
    if json_out:
        print_json(page)
        return
    table(
        "MLflow sources",
        ["registered model", "lineage", "role", "aliases"],
        [
            (r.registered_model, r.lineage, r.role, ", ".join(r.aliases) or "all")
            for r in page.items
        ],
    )


@mlflow_app.command("deliveries")
def mlflow_deliveries(json_out: bool = JSON, limit: int = typer.Option(100)) -> None:
    """Deliveries accepted from MLflow, with what each did."""
    page = get_backend().list_mlflow_deliveries(limit=limit)
    if json_out:
        print_json(page)
        return
    table(
        "MLflow deliveries",
        ["delivery id", "event", "received", "action", "artifact"],
        [
            (
                d.delivery_id,
                d.event,
                f"{d.received_at:%Y-%m-%d %H:%M:%S}",
                str(d.outcome.get("action")),
                f"{d.outcome.get('lineage')}@v{d.outcome.get('artifact_version')}"
                if d.outcome.get("artifact_id")
                else "-",
            )
            for d in page.items
        ],
    )
