"""The runner's side of a measurement job: plain data in, plain results out.

:class:`RunnerExecutor` is what ``pairreg worker``, ``pairreg serve`` and ``pairreg
measure`` hand to the registry's job loop (or call directly). It picks the suite's prompts,
runs ``measure_pair`` on directories the loop has already verified, adds the figures the
gates need (divergence from plain greedy for lossy pairs, teacher-forced overlaps for drift
jobs) and logs the MLflow run. It decides nothing: the registry's services do.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from registry.errors import InvalidInput
from registry.methods import RUNNABLE_METHODS
from runner.measure import measure_pair, plain_greedy
from runner.mlflow_log import default_tracking_uri, log_measurement
from runner.models import load_causal_lm, load_tokenizer, resolve_device
from runner.overlap import teacher_forced_overlap
from runner.render import encode_prompt
from runner.serving_config import serving_config
from runner.settings import MeasureSettings
from runner.suites import Prompt, Suite, load_suite, suite_digest
from runner.version import RUNNER_VERSION

TEACHER_FORCED_TOKENS = 32


class RunnerError(InvalidInput):
    """A task the runner cannot run as asked (unknown suite, a method it does not run, a
    model that does not fit); the job fails at once instead of being retried."""


def mlflow_enabled() -> bool:
    return os.environ.get("PAIRREG_MLFLOW", "1") != "0"


def select_prompts(suite: Suite, categories: Sequence[str] | None, per_category: int) -> list:
    """The suite's prompts, restricted to ``categories`` and the first N of each."""
    chosen: list[Prompt] = []
    counts: dict[str, int] = {}
    for p in suite.prompts:
        if categories and p.category not in categories:
            continue
        if per_category and counts.get(p.category, 0) >= per_category:
            continue
        counts[p.category] = counts.get(p.category, 0) + 1
        chosen.append(p)
    if not chosen:
        raise RunnerError(
            f"suite {suite.name} has no prompts in {', '.join(categories or [])}",
            field="categories",
        )
    return chosen


def suite_prompts(name: str, categories: Sequence[str] | None, per_category: int) -> list:
    try:
        suite = load_suite(name)
    except ValueError as exc:
        raise RunnerError(str(exc), field="suite") from exc
    return select_prompts(suite, categories, per_category)


def runner_settings(settings: dict[str, Any], device: str) -> MeasureSettings:
    """The registry's measurement settings as the runner's dataclass (unknown keys ignored,
    so an older runner still reads a newer registry's settings)."""
    known = set(MeasureSettings.__dataclass_fields__)
    values = {k: v for k, v in settings.items() if k in known}
    values["device"] = device
    if values.get("method") not in RUNNABLE_METHODS:
        raise RunnerError(
            f"the embedded runner cannot measure method {values.get('method')!r}; "
            f"it runs {', '.join(RUNNABLE_METHODS)}",
            field="method",
        )
    return MeasureSettings(**values)


def divergence(
    target_dir: str,
    prompts: Sequence[Prompt],
    rows: list[dict[str, Any]],
    settings: MeasureSettings,
    categories: Sequence[str],
) -> None:
    """For lossy pairs: where each prompt's output first leaves the target's own greedy
    answer (``divergence_at`` on each row of ``categories``; None when it never does)."""
    device = resolve_device(settings.device)
    tok = load_tokenizer(target_dir)
    model = load_causal_lm(target_dir, device, settings.dtype)
    by_id = {p.id: p for p in prompts}
    for row in rows:
        if row["category"] not in categories:
            continue
        ids = encode_prompt(tok, by_id[row["id"]])
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
    prompts: Sequence[Prompt],
    baseline_rows: list[dict[str, Any]],
    device: str,
) -> dict[str, Any]:
    """Mean Σ min(p, q) on the baseline's frozen continuations: draft vs old target, draft
    vs new target, old vs new target (deterministic, no sampling noise)."""
    tok = load_tokenizer(old_target_dir)
    by_id = {p.id: p for p in prompts}
    items = []
    for row in baseline_rows:
        p = by_id.get(row["id"])
        cont = list(row.get("output_ids") or [])[:TEACHER_FORCED_TOKENS]
        if p is not None and cont:
            items.append((encode_prompt(tok, p), cont))
    dev = resolve_device(device)
    old = load_causal_lm(old_target_dir, dev)
    new = load_causal_lm(new_target_dir, dev)
    out: dict[str, Any] = {"items": len(items), "tokens_per_item": TEACHER_FORCED_TOKENS}
    out["old_vs_new_target"] = teacher_forced_overlap(old, new, items, device=device)["mean"]
    if draft_dir:
        draft = load_causal_lm(draft_dir, dev)
        for name, model in (("draft_vs_old_target", old), ("draft_vs_new_target", new)):
            out[name] = teacher_forced_overlap(draft, model, items, device=device)["mean"]
    return out


class RunnerExecutor:
    """Measures tasks on this machine (see :class:`registry.jobloop.Executor`)."""

    runner_version = RUNNER_VERSION

    def __init__(self, *, log_runs: bool | None = None):
        self.log_runs = mlflow_enabled() if log_runs is None else log_runs

    def suite_digest(
        self, suite_name: str, categories: Sequence[str] | None, prompts_per_category: int
    ) -> str:
        """The digest of the prompts :meth:`measure` would run for that suite choice (an
        embedded validate reuses only a measurement of the same prompts)."""
        return suite_digest(suite_prompts(suite_name, categories, prompts_per_category))

    def measure(
        self, task: Any, progress: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        """Measure ``task`` (a ``registry.jobloop.MeasureTask``); returns what
        ``complete_job`` and ``store_measurement`` take."""
        prompts = suite_prompts(task.suite_name, task.categories, task.prompts_per_category)
        s = runner_settings(task.settings, task.device)
        digest = suite_digest(prompts)
        try:
            result = measure_pair(
                task.target_dir, task.drafter_dir, prompts, s, progress=progress,
                suite_digest=digest,
            )  # fmt: skip
        except ValueError as exc:
            raise RunnerError(str(exc), field="pair") from exc
        data = result.to_dict()
        if task.lossy:
            divergence(task.target_dir, prompts, data["prompts"], s, task.divergence_categories)
        data["prompts_per_category"] = task.prompts_per_category
        data["suite_name"] = task.suite_name
        data["serving_config"] = serving_config(
            task.settings, task.target_dir, task.drafter_dir,
            engine="runner", engine_version=RUNNER_VERSION,
        )  # fmt: skip
        for key in ("target_dir", "drafter_dir"):
            data.pop(key, None)
        out: dict[str, Any] = {
            "result": data,
            "suite_digest": digest,
            "runner_version": data["runner_version"],
            "mlflow_run_id": None,
            "device": (data.get("hardware") or {}).get("device"),
            "settings": task.settings,
        }
        tf = task.teacher_forced
        if tf is not None:
            try:
                out["teacher_forced"] = teacher_forced(
                    tf.draft_dir, tf.old_target_dir, task.target_dir, prompts,
                    tf.baseline_prompts, task.device,
                )  # fmt: skip
            except (ValueError, OSError) as exc:
                out["teacher_forced"] = {"error": str(exc)}
        if self.log_runs:
            params = {"pair_digest": task.pair_digest, "suite": task.suite_name}
            out["mlflow_run_id"] = log_measurement(data, {**params, **task.mlflow_params})
        return out

    def log_validation(self, validation: Any) -> str | None:
        """One MLflow run per validation with its gate results (params + 0/1 metrics)."""
        if not self.log_runs:
            return None
        from mlflow.tracking import MlflowClient

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
