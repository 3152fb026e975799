"""``pairreg measure`` and the glue that turns a pair record into a runner call.

This is the edge where the registry meets the runner: resolve the pair's artifacts to local
directories, pick the suite's prompts, run ``runner.measure_pair``, add the figures the
gates need (divergence from plain greedy for lossy pairs, teacher-forced overlaps for drift
jobs), log the MLflow run, and hand plain dicts back to a registry service. Nothing here
decides anything: the services do.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from cli.backend import get_backend
from cli.render import console, err_console, print_json, table
from registry.errors import InvalidInput
from registry.methods import RUNNABLE_METHODS as RUNNER_METHODS
from registry.records import ArtifactRecord, PairRecord

JSON = typer.Option(False, "--json", help="Machine-readable output.")

TEACHER_FORCED_TOKENS = 32


def local_dir(art: ArtifactRecord) -> str:
    """Where the artifact's files are on this machine (its path, or its Hub cache snapshot)."""
    if art.local_path and Path(art.local_path).is_dir():
        return art.local_path
    if art.source_kind == "hf" and art.hub_repo and art.hub_commit:
        from registry.hub import repo_cache_dir

        snap = repo_cache_dir(art.hub_repo) / "snapshots" / art.hub_commit
        if snap.is_dir():
            return str(snap)
        try:
            from huggingface_hub import snapshot_download

            return snapshot_download(art.hub_repo, revision=art.hub_commit)
        except Exception as exc:  # noqa: BLE001 - any download failure is the same to the user
            raise InvalidInput(
                f"artifact {art.ref} is not available locally and could not be downloaded: {exc}",
                field="pair",
            ) from exc
    raise InvalidInput(f"artifact {art.ref} has no local copy on this machine", field="pair")


def select_prompts(suite: Any, categories: list[str] | None, per_category: int) -> list[Any]:
    """The suite's prompts, restricted to ``categories`` and the first N of each."""
    chosen: list[Any] = []
    counts: dict[str, int] = {}
    for p in suite.prompts:
        if categories and p.category not in categories:
            continue
        if per_category and counts.get(p.category, 0) >= per_category:
            continue
        counts[p.category] = counts.get(p.category, 0) + 1
        chosen.append(p)
    if not chosen:
        raise InvalidInput(
            f"suite {suite.name} has no prompts in {', '.join(categories or [])}",
            field="categories",
        )
    return chosen


def runner_settings(settings: dict[str, Any], device: str) -> Any:
    from runner import MeasureSettings

    known = set(MeasureSettings.__dataclass_fields__)
    values = {k: v for k, v in settings.items() if k in known}
    values["device"] = device
    if values.get("method") not in RUNNER_METHODS:
        raise InvalidInput(
            f"the embedded runner cannot measure method {values.get('method')!r}; "
            f"it runs {', '.join(RUNNER_METHODS)}",
            field="method",
        )
    return MeasureSettings(**values)


def _divergence(
    pair: PairRecord,
    target_dir: str,
    prompts: list[Any],
    rows: list[dict],
    settings: Any,
    categories: list[str],
) -> None:
    """For lossy pairs: where each adversarial prompt's output leaves plain greedy."""
    from runner import plain_greedy
    from runner.measure import encode_prompt
    from runner.models import load_causal_lm, load_tokenizer, resolve_device

    device = resolve_device(settings.device)
    tok = load_tokenizer(target_dir)
    model = load_causal_lm(target_dir, device, settings.dtype)
    by_id = {p.id: p for p in prompts}
    for row in rows:
        if row["category"] not in categories:
            continue
        ids = encode_prompt(tok, by_id[row["id"]].prompt)
        ref = plain_greedy(model, ids, settings.max_new_tokens)
        out = list(row.get("output_ids") or [])
        at = next((i for i, (a, b) in enumerate(zip(out, ref, strict=False)) if a != b), None)
        if at is None and len(out) != len(ref):
            at = min(len(out), len(ref))
        row["divergence_at"] = at


def teacher_forced(
    draft_dir: str | None,
    old_target_dir: str,
    new_target_dir: str,
    prompts: list[Any],
    baseline_rows: list[dict],
    device: str,
) -> dict[str, Any]:
    """Mean Σ min(p, q) on the baseline's frozen continuations: draft vs old target, draft
    vs new target, old vs new target (deterministic, no sampling noise)."""
    from runner import teacher_forced_overlap
    from runner.measure import encode_prompt
    from runner.models import load_causal_lm, load_tokenizer, resolve_device

    tok = load_tokenizer(old_target_dir)
    by_id = {p.id: p for p in prompts}
    items = []
    for row in baseline_rows:
        p = by_id.get(row["id"])
        cont = list(row.get("output_ids") or [])[:TEACHER_FORCED_TOKENS]
        if p is not None and cont:
            items.append((encode_prompt(tok, p.prompt), cont))
    dev = resolve_device(device)
    old = load_causal_lm(old_target_dir, dev)
    new = load_causal_lm(new_target_dir, dev)
    out: dict[str, Any] = {"items": len(items), "tokens_per_item": TEACHER_FORCED_TOKENS}
    out["old_vs_new_target"] = teacher_forced_overlap(old, new, items, device=device)["mean"]
    if draft_dir:
        draft = load_causal_lm(draft_dir, dev)
        out["draft_vs_old_target"] = teacher_forced_overlap(draft, old, items, device=device)[
            "mean"
        ]
        out["draft_vs_new_target"] = teacher_forced_overlap(draft, new, items, device=device)[
            "mean"
        ]
    return out


def mlflow_enabled() -> bool:
    return os.environ.get("PAIRREG_MLFLOW", "1") != "0"


def run_measurement(
    pair: PairRecord,
    *,
    suite_name: str,
    categories: list[str] | None,
    prompts_per_category: int,
    settings: dict[str, Any],
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    divergence_categories: list[str] | None = None,
    mlflow_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure ``pair`` and return what ``store_measurement``/``complete_job`` take."""
    from runner import load_suite, measure_pair, suite_digest

    try:
        suite = load_suite(suite_name)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="suite") from exc
    prompts = select_prompts(suite, categories, prompts_per_category)
    s = runner_settings(settings, device)
    target_dir = local_dir(pair.target)
    drafter_dir = local_dir(pair.drafter) if pair.drafter else None
    digest = suite_digest(prompts)
    result = measure_pair(
        target_dir, drafter_dir, prompts, s, progress=progress, suite_digest=digest
    )
    data = result.to_dict()
    if pair.lossy:
        _divergence(
            pair, target_dir, prompts, data["prompts"], s, divergence_categories or ["adversarial"]
        )
    data["prompts_per_category"] = prompts_per_category
    data["suite_name"] = suite.name
    for key in ("target_dir", "drafter_dir"):
        data.pop(key, None)
    run_id = None
    if mlflow_enabled():
        from runner import log_measurement

        params = {"pair_digest": pair.pair_digest, "suite": suite_name, **(mlflow_params or {})}
        run_id = log_measurement(data, params)
    return {
        "result": data,
        "suite_digest": digest,
        "runner_version": data["runner_version"],
        "mlflow_run_id": run_id,
        "device": (data.get("hardware") or {}).get("device"),
        "settings": settings,
        "prompts": prompts,
    }


def log_validation_run(validation: Any) -> str | None:
    """One MLflow run per validation with its gate results (params + 0/1 metrics)."""
    if not mlflow_enabled():
        return None
    import logging

    from mlflow.tracking import MlflowClient

    from runner import default_tracking_uri

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=default_tracking_uri())
    exp = client.get_experiment_by_name("pairreg-validations")
    exp_id = exp.experiment_id if exp else client.create_experiment("pairreg-validations")
    run = client.create_run(exp_id, tags={"pairreg.passed": str(validation.passed)})
    rid = run.info.run_id
    client.log_param(rid, "pair_digest", validation.pair_digest)
    client.log_param(rid, "policy", validation.policy_name)
    client.log_param(rid, "policy_digest", validation.policy_digest)
    client.log_param(rid, "measurement_id", str(validation.measurement_id))
    client.log_metric(rid, "passed", 1.0 if validation.passed else 0.0)
    for g in validation.gates:
        client.log_metric(rid, f"gate.{g.name}", 1.0 if g.passed else 0.0)
        client.set_tag(rid, f"gate.{g.name}", f"required {g.required}; measured {g.measured}")
    client.set_terminated(rid, "FINISHED")
    return rid


def record_validation_run(backend: Any, validation: Any) -> Any:
    """Log a validation's MLflow run and attach it, once: a run attached meanwhile wins.

    Whoever creates a validation calls this (the CLI for reused measurements, the worker
    for the ones its jobs produce); workers also sweep up any that were left without one.
    """
    if validation.mlflow_run_id is not None:
        return validation
    try:
        run_id = log_validation_run(validation)
    except Exception as exc:  # noqa: BLE001 - the validation stands without its run
        err_console.print(f"[yellow]warning:[/] MLflow run not logged: {exc}")
        return validation
    if not run_id:
        return validation
    try:
        return backend.set_validation_run(id=validation.id, mlflow_run_id=run_id)
    except InvalidInput:
        return backend.get_validation(id=validation.id)


def _progress_bar(total_hint: str) -> tuple[Any, Callable[[int, int], None]]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn(total_hint),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    task = bar.add_task("measure", total=None)

    def tick(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, tick


def measure(
    pair: str = typer.Argument(..., help="Pair id or digest prefix."),
    suite: str = typer.Option("default", "--suite", help="Built-in suite name or JSONL file."),
    categories: list[str] = typer.Option([], "--categories", help="Only these (repeatable)."),
    per_category: int = typer.Option(0, "--per-category", help="First N prompts per category."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 is greedy."),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda"),
    json_out: bool = JSON,
) -> None:
    """Measure a pair's acceptance on a suite, store it, and log an MLflow run."""
    from registry.policy import measurement_settings

    backend = get_backend()
    rec = backend.get_pair(ref=pair)
    cats = [c for item in categories for c in item.split(",") if c]
    settings = measurement_settings(
        rec.config, {"temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed}
    )
    bar, tick = _progress_bar(f"measuring {rec.pair_digest[:12]}")
    with bar:
        out = run_measurement(
            rec,
            suite_name=suite,
            categories=cats or None,
            prompts_per_category=per_category,
            settings=settings,
            device=device,
            progress=tick,
        )
    stored = backend.store_measurement(
        pair=rec.pair_digest,
        suite_name=suite,
        suite_digest=out["suite_digest"],
        settings=settings,
        runner_version=out["runner_version"],
        result=out["result"],
        mlflow_run_id=out["mlflow_run_id"],
        device=out["device"],
    )
    data = out["result"]
    if json_out:
        print_json(
            {
                "pair_digest": rec.pair_digest,
                "suite_digest": out["suite_digest"],
                "settings": data["settings"],
                "categories": data["categories"],
                "overall": data["overall"],
                "prompts": data["prompts"],
                "mlflow_run_id": out["mlflow_run_id"],
                "measurement_id": stored.id,
            }
        )
        return
    render_categories(data["categories"], data["overall"])
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
