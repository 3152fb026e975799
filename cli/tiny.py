"""``pairreg tiny``: build the tiny deterministic reference pairs (no downloads)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

app = typer.Typer(help="Tiny reference model pairs for demos and tests.", no_args_is_help=True)


@app.command("build")
def build(
    directory: Path | None = typer.Argument(
        None, help="Output directory (default: <user cache>/pairreg/tiny/<recipe digest>)."
    ),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a build exists."),
) -> None:
    """Train target-v1, draft, Medusa heads and target-v2 (about a minute on 2 cores)."""
    from builders.tiny import build_tiny_pairs, is_built, tiny_paths

    console = Console()
    out = str(directory) if directory is not None else None
    paths = tiny_paths(out)
    t0 = time.perf_counter()
    if not force and is_built(paths.root):
        console.print(f"[green]already built[/green] in {paths.root}")
    else:
        with Progress(
            TextColumn("[bold]{task.fields[stage]:<10}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("build", total=None, stage="start")

            def progress(stage: str, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, stage=stage)

            paths = build_tiny_pairs(out, progress=progress, force=force)
        console.print(f"built in {time.perf_counter() - t0:.1f} s")
    for name, path in paths.to_dict().items():
        console.print(f"  {name:<10} {path}")


@app.callback()
def _group() -> None:
    """Keep ``build`` a subcommand even when this app is used on its own."""
