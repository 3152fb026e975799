"""``pairreg demo``: seed the embedded registry with the tiny reference pairs, end to end.

It drives the same commands a user would type (add, register, validate, promote), so a
newcomer's first server has a validated pair live on a deployment, real measurements in
MLflow and an audit trail to look at. Idempotent: a registry where the demo deployment is
already live is left alone.
"""

from __future__ import annotations

import time

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cli.backend import get_backend
from cli.render import console
from registry.errors import NotFound
from registry.governance.policy import DEFAULT_POLICY_PATH

DEMO_DEPLOYMENT = "demo"
POLICY_FILE = DEFAULT_POLICY_PATH.with_name("demo.toml")
PROVENANCE = [
    "--publisher",
    "pairreg-demo",
    "--license",
    "MIT",
    "--training-data",
    "Python standard library source (built locally)",
]


def _run(args: list[str]) -> int:
    """Run one ``pairreg`` command in-process and return its exit code."""
    from cli.main import app

    console.print(f"[bold]$ pairreg {' '.join(args)}[/]")
    rc = app(args, standalone_mode=False)
    return rc if isinstance(rc, int) else 0


def demo(
    force: bool = typer.Option(False, "--force", help="Seed even if the demo is already live."),
) -> None:
    """Build the tiny pairs (cached), register, validate and promote them to `demo`."""
    from builders.tiny import build_tiny_pairs

    backend = get_backend()
    if not force:
        try:
            dep = backend.get_deployment(name=DEMO_DEPLOYMENT)
        except NotFound:
            dep = None
        if dep is not None and dep.current_pair_id is not None:
            console.print(f"demo already seeded: deployment {DEMO_DEPLOYMENT} is live")
            return
    started = time.monotonic()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("building tiny pairs", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(
                task, description=f"building tiny pairs: {stage}", completed=done, total=total
            )

        tiny = build_tiny_pairs(progress=progress)
    base = ["artifact", "add"]
    steps = [
        base + [tiny.target_v1, "--name", "tiny/target-v1", "--role", "target", *PROVENANCE],
        base
        + [
            tiny.draft,
            "--name",
            "tiny/draft",
            "--role",
            "draft",
            *PROVENANCE,
            "--trained-against",
            "tiny/target-v1@v1",
        ],
        ["policy", "put", str(POLICY_FILE)],
    ]
    for args in steps:
        if _run(args) != 0:
            raise typer.Exit(1)
    pair = backend.register_pair(
        target="tiny/target-v1@v1", draft="tiny/draft@v1", method="draft_model", k=4
    ).pair
    backend.register_pair(target="tiny/target-v1@v1", method="prompt_lookup", k=4)
    console.print(f"pair {pair.id}: {pair.pair_digest}")
    try:
        backend.get_deployment(name=DEMO_DEPLOYMENT)
    except NotFound:
        backend.create_deployment(name=DEMO_DEPLOYMENT, policy="demo")
    digest = pair.pair_digest[:16]
    if _run(["validate", digest, "--deployment", DEMO_DEPLOYMENT]) != 0:
        console.print("[red]the demo pair did not validate; see the gates above[/]")
        raise typer.Exit(1)
    _run(["promote", digest, "--deployment", DEMO_DEPLOYMENT, "--reason", "demo seed"])
    console.print(
        f"demo seeded in {time.monotonic() - started:.0f} s. Next: register "
        f"{tiny.target_v2} as a new version of tiny/target-v1 and watch the drift flag open."
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
