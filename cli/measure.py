"""``pairreg measure``: measure a pair now, on this machine, and store the measurement.

The glue lives elsewhere: ``registry.flows.measure_now`` materialises and verifies the
pair's files, builds the plain task, has the executor measure it (``runner.executor``) and
stores the measurement. This command only wires them, shows a progress bar and renders the
figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from cli.backend import get_backend
from cli.render import console, err_console, print_json, table
from registry.flows import measure_now
from registry.jobloop import Executor
from registry.settings import get_settings

JSON = typer.Option(False, "--json", help="Machine-readable output.")


def _runner_executor() -> Executor:
    from runner.executor import RunnerExecutor  # torch loads only for commands that run it

    return RunnerExecutor()


@contextmanager
def _progress_bar(pair_digest: str) -> Iterator[Callable[[int, int], None]]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn(f"measuring {pair_digest[:12]}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    task = bar.add_task("measure", total=None)

    def tick(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    with bar:
        yield tick


def measure(
    pair: str = typer.Argument(..., help="Pair id or digest prefix."),
    suite: str = typer.Option(
        "default", "--suite", help="Built-in suite (default, chat, chat:CATEGORY, …) or JSONL."
    ),
    categories: list[str] = typer.Option([], "--categories", help="Only these (repeatable)."),
    per_category: int = typer.Option(0, "--per-category", help="First N prompts per category."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 is greedy."),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda"),
    json_out: bool = JSON,
) -> None:
    """Measure a pair's acceptance on a suite, store it, and log an MLflow run."""
    done = measure_now(
        get_backend(),
        _runner_executor,
        ref=pair,
        suite=suite,
        categories=[c for item in categories for c in item.split(",") if c],
        prompts_per_category=per_category,
        overrides={"temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed},
        device=device,
        state_dir=get_settings().cache_dir / "verified",
        verifying=lambda: err_console.status("verifying the pair's files against their manifests…"),
        measuring=_progress_bar,
    )
    out, stored, digest = done.out, done.stored, done.task.pair_digest
    data = out["result"]
    if json_out:
        print_json(
            {
                "pair_digest": digest,
                "suite_digest": out["suite_digest"],
                "settings": data["settings"],
                "categories": data["categories"],
                "overall": data["overall"],
                "prompts": data["prompts"],
                "mlflow_run_id": out["mlflow_run_id"],
                "measurement_id": stored.id,
                "economics": data.get("economics"),
            }
        )
        return
    render_categories(data["categories"], data["overall"])
    econ = data.get("economics") or {}
    if econ.get("speedup_measured") is not None:
        console.print(
            f"speed-up vs plain decoding on the same prompts: {econ['speedup_measured']:.3f} "
            f"measured, {_f(econ.get('speedup_predicted'))} predicted from the step times "
            f"(c = {_f(econ.get('cost_ratio_c'))}); `pairreg economics` for batch sizes",
            highlight=False,
        )
    console.print(f"measurement {stored.id} stored; MLflow run {out['mlflow_run_id'] or '-'}")


def _f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def render_categories(categories: dict[str, Any], overall: dict[str, Any] | None) -> None:
    rows = []
    for name, c in sorted(categories.items()):
        ci = c.get("alpha_ci") or [None, None]
        rows.append(
            [
                name,
                c.get("prompts"),
                _f(c.get("alpha")),
                f"[{_f(ci[0])}, {_f(ci[1])}]",
                _f(c.get("draft_acceptance_rate")),
                _f(c.get("tau"), ".2f"),
                _f(c.get("expected_alpha")),
            ]
        )
    if overall:
        ci = overall.get("alpha_ci") or [None, None]
        rows.append(
            [
                "(overall)",
                overall.get("prompts"),
                _f(overall.get("alpha")),
                f"[{_f(ci[0])}, {_f(ci[1])}]",
                _f(overall.get("draft_acceptance_rate")),
                _f(overall.get("tau"), ".2f"),
                _f(overall.get("expected_alpha")),
            ]
        )
    table(
        "acceptance",
        ["category", "prompts", "α", "α 95% CI", "accepted/drafted", "τ", "E[Σmin(p,q)]"],
        rows,
    )
