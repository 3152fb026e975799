"""Governance commands: validate, promote, rollback, deployments, policies, jobs, drift,
watch, plus ``measure`` and ``worker`` (wired in cli.measure/cli.worker).

Every command parses, calls one backend operation (embedded or remote), and renders. The
one exception is ``validate`` in embedded mode: when no stored measurement matches, it runs
the queued job in-process (the same code path a worker runs) so a laptop user needs no
separate worker; in remote mode it waits for the server's worker.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from cli import measure as measure_cli
from cli import worker as worker_cli
from cli.backend import get_backend
from cli.render import console, err_console, kv, print_json, short, table
from registry.errors import InvalidInput
from registry.flows import LocalExecutor, validate_and_wait
from registry.records.governance import ValidateResult
from registry.settings import get_settings
from registry.trust.measurement_signing import verify_record

JSON = typer.Option(False, "--json", help="Machine-readable output.")

deployment_app = typer.Typer(no_args_is_help=True, help="Deployments: show, list, create.")
policy_app = typer.Typer(no_args_is_help=True, help="Policies: put, show, list.")
jobs_app = typer.Typer(no_args_is_help=True, help="Measurement jobs: list, show.")
drift_app = typer.Typer(no_args_is_help=True, help="Drift and integrity flags: list, show, ack.")
measurement_app = typer.Typer(no_args_is_help=True, help="Stored measurements: list, show.")


def _policy_args(policy: str | None) -> tuple[str | None, str | None]:
    """(name, text): a path to a TOML file is read and sent as text."""
    if policy and (policy.endswith(".toml") or "/" in policy) and Path(policy).is_file():
        return None, Path(policy).read_text(encoding="utf-8")
    if policy and policy.endswith(".toml"):
        raise InvalidInput(f"policy file {policy} does not exist", field="policy")
    return policy, None


def _runner_executor() -> LocalExecutor:
    from runner.executor import RunnerExecutor  # torch loads only when something runs

    return RunnerExecutor()


def render_gates(validation: Any) -> None:
    table(
        f"validation {validation.id}: pair {short(validation.pair_digest)} "
        f"policy {validation.policy_name}",
        ["gate", "required", "measured", "result"],
        [
            [g.name, g.required, g.measured, "pass" if g.passed else "FAIL"]
            for g in validation.gates
        ],
    )


def validate(
    pair: str = typer.Argument(..., help="Pair id or digest prefix."),
    policy: str | None = typer.Option(None, "--policy", help="Policy name or TOML file."),
    deployment: str | None = typer.Option(None, "--deployment", help="Validate for it."),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda (embedded runs)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for the measurement."),
    timeout: float = typer.Option(3600.0, "--timeout", help="Seconds to wait for the job."),
    json_out: bool = JSON,
) -> None:
    """Measure (or reuse a measurement) and evaluate every gate; exit 0 when all pass."""
    backend = get_backend()
    name, text = _policy_args(policy)
    out = validate_and_wait(
        backend,
        _runner_executor,
        ref=pair,
        policy=name,
        policy_text=text,
        deployment=deployment,
        device=device,
        wait=wait,
        timeout=timeout,
        state_dir=get_settings().cache_dir / "verified",
        log=lambda m: err_console.print(m, highlight=False),
    )
    if isinstance(out, ValidateResult):  # queued, not waited for
        assert out.job is not None
        if json_out:
            print_json(out)
        else:
            console.print(f"measurement queued as job {out.job.id}")
        raise typer.Exit(3)
    validation = out
    if json_out:
        print_json(validation)
    else:
        render_gates(validation)
        verdict = "[green]validated[/]" if validation.passed else "[red]not validated[/]"
        console.print(
            f"{verdict} under policy {validation.policy_name} "
            f"(measurement {validation.measurement_id})"
        )
    raise typer.Exit(0 if validation.passed else 1)


def promote(
    pair: str = typer.Argument(..., help="Pair id or digest prefix."),
    deployment: str = typer.Option(..., "--deployment", help="Deployment name."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded in the history)."),
    create: bool = typer.Option(False, "--create", help="Create the deployment if missing."),
    expect_version: int | None = typer.Option(
        None, "--expect-version", help="Refuse if the deployment moved past this version."
    ),
    json_out: bool = JSON,
) -> None:
    """Make PAIR the live pair of a deployment; the gates are re-checked as it happens."""
    res = get_backend().promote(
        ref=pair, deployment=deployment, reason=reason, create=create, expect_version=expect_version
    )
    if json_out:
        print_json(res)
        return
    ev = res.event
    console.print(
        f"{deployment}: {short(ev.from_pair_digest)} → {short(ev.to_pair_digest)} "
        f"(version {ev.seq}, by {ev.actor})"
    )


def rollback(
    deployment: str = typer.Option(..., "--deployment", help="Deployment name."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded in the history)."),
    json_out: bool = JSON,
) -> None:
    """Return a deployment to the pair that was live before the current one."""
    res = get_backend().rollback(deployment=deployment, reason=reason)
    if json_out:
        print_json(res)
        return
    ev = res.event
    console.print(
        f"{deployment}: rolled back {short(ev.from_pair_digest)} → "
        f"{short(ev.to_pair_digest)} (version {ev.seq})"
    )


def show_deployment(dep: Any) -> None:
    kv(
        f"deployment {dep.name}",
        [
            ("live pair", dep.current_pair_digest or "none"),
            ("policy", dep.policy_name),
            ("version", dep.version),
            ("created", f"{dep.created_at:%Y-%m-%d %H:%M:%S} by {dep.created_by}"),
        ],
    )
    table(
        "history",
        ["seq", "action", "from", "to", "actor", "time (UTC)", "reason"],
        [
            [
                e.seq,
                e.action,
                short(e.from_pair_digest),
                short(e.to_pair_digest),
                e.actor,
                f"{e.at:%Y-%m-%d %H:%M:%S}",
                e.reason,
            ]
            for e in dep.history or []
        ],
    )


@deployment_app.command("show")
def deployment_show(name: str = typer.Argument(...), json_out: bool = JSON) -> None:
    """The live pair and the full history (pair, actor, time, reason)."""
    dep = get_backend().get_deployment(name=name)
    if json_out:
        print_json(dep)
    else:
        show_deployment(dep)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


@deployment_app.command("online")
def deployment_online(
    name: str = typer.Argument(...),
    bucket_seconds: int = typer.Option(3600, "--bucket", help="Bucket width, multiple of 300 s."),
    json_out: bool = JSON,
) -> None:
    """Online α from served requests, and the sequential test against the validated α."""
    view = get_backend().deployment_online_alpha(name=name, bucket_seconds=bucket_seconds)
    if json_out:
        print_json(view)
        return
    table(
        f"online α on {view.deployment} (test: e-value ≥ 1/level raises a workload flag)",
        ["pair", "live", "state", "validated", "online", "tested", "e-value", "level", "flag"],
        [
            [
                short(m.pair_digest),
                "yes" if m.live else "",
                m.state,
                _rate(m.validated_alpha),
                _rate(m.alpha),
                m.tested,
                f"{m.e_value:.3g}",
                f"{m.level:g}",
                m.flag_id or "",
            ]
            for m in view.monitors
        ],
    )
    table(
        f"buckets of {view.bucket_seconds} s",
        ["start (UTC)", "pair", "requests", "tested", "α", "validated", "e-value", "state"],
        [
            [
                f"{b.start:%Y-%m-%d %H:%M}",
                short(b.pair_digest),
                b.requests,
                b.tested,
                _rate(b.alpha),
                _rate(b.validated_alpha),
                f"{b.e_value:.3g}",
                b.state,
            ]
            for b in view.buckets[-48:]
        ],
    )


@deployment_app.command("create")
def deployment_create(
    name: str = typer.Argument(...),
    policy: str = typer.Option("default", "--policy", help="Policy the deployment enforces."),
    json_out: bool = JSON,
) -> None:
    """Create an empty deployment bound to a policy."""
    dep = get_backend().create_deployment(name=name, policy=policy)
    if json_out:
        print_json(dep)
    else:
        console.print(f"deployment {dep.name} created (policy {dep.policy_name})")


@deployment_app.command("list")
def deployment_list(
    cursor: str | None = typer.Option(None, "--cursor"),
    limit: int = typer.Option(100, "--limit"),
    json_out: bool = JSON,
) -> None:
    page = get_backend().list_deployments(cursor=cursor, limit=limit)
    if json_out:
        print_json(page)
        return
    table(
        "deployments",
        ["name", "live pair", "policy", "version", "updated"],
        [
            [
                d.name,
                short(d.current_pair_digest),
                d.policy_name,
                d.version,
                f"{d.updated_at:%Y-%m-%d %H:%M:%S}",
            ]
            for d in page.items
        ],
    )


@deployment_app.command("at")
def deployment_at(
    name: str = typer.Argument(...),
    at: str = typer.Argument(..., help="ISO-8601 time, e.g. 2026-01-31T12:00:00Z."),
    json_out: bool = JSON,
) -> None:
    """Which pair served the deployment at that time."""
    try:
        when = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(f"time {at!r} is not ISO-8601", field="at") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    ev = get_backend().deployment_at(name=name, at=when)
    if json_out:
        print_json(ev)
    elif ev is None:
        console.print(f"{name} served no pair at {when.isoformat()}")
    else:
        console.print(
            f"{name} at {when.isoformat()}: {ev.to_pair_digest} "
            f"(since {ev.at.isoformat()}, {ev.action} by {ev.actor}: {ev.reason})"
        )


@policy_app.command("put")
def policy_put(
    file: Path = typer.Argument(..., help="Policy TOML file."),
    name: str | None = typer.Option(None, "--name", help="Store under this name instead."),
    json_out: bool = JSON,
) -> None:
    """Store a policy (a new version when its content changed)."""
    if not file.is_file():
        raise InvalidInput(f"policy file {file} does not exist", field="file")
    res = get_backend().put_policy(text=file.read_text(encoding="utf-8"), name=name)
    if json_out:
        print_json(res)
    else:
        verb = "stored" if res.created else "unchanged:"
        console.print(
            f"{verb} policy {res.policy.name} v{res.policy.version} ({short(res.policy.digest)})"
        )


@policy_app.command("show")
def policy_show(
    name: str = typer.Argument("default"),
    version: int | None = typer.Option(None, "--version"),
    json_out: bool = JSON,
) -> None:
    pol = get_backend().get_policy(name=name, version=version)
    if json_out:
        print_json(pol)
        return
    console.print(f"# policy {pol.name} v{pol.version} digest {pol.digest}")
    console.print(pol.toml_text, highlight=False, markup=False)


@policy_app.command("list")
def policy_list(json_out: bool = JSON) -> None:
    page = get_backend().list_policies()
    if json_out:
        print_json(page)
        return
    table(
        "policies",
        ["name", "version", "digest", "created"],
        [
            [
                p.name,
                p.version,
                short(p.digest),
                f"{p.created_at:%Y-%m-%d %H:%M:%S} by {p.created_by}",
            ]
            for p in page.items
        ],
    )


@jobs_app.command("list")
def jobs_list(
    state: str | None = typer.Option(None, "--state", help="queued|running|done|failed"),
    cursor: str | None = typer.Option(None, "--cursor"),
    limit: int = typer.Option(100, "--limit"),
    json_out: bool = JSON,
) -> None:
    page = get_backend().list_jobs(state=state, cursor=cursor, limit=limit)
    if json_out:
        print_json(page)
        return
    table(
        "jobs",
        ["id", "kind", "pair", "state", "attempts", "lease owner", "updated"],
        [
            [
                j.id,
                j.kind,
                short(j.args.get("pair_digest")),
                j.state,
                f"{j.attempts}/{j.max_attempts}",
                j.lease_owner,
                f"{j.updated_at:%Y-%m-%d %H:%M:%S}",
            ]
            for j in page.items
        ],
    )


@jobs_app.command("show")
def jobs_show(id: int = typer.Argument(...), json_out: bool = JSON) -> None:
    job = get_backend().get_job(id=id)
    if json_out:
        print_json(job)
        return
    kv(
        f"job {job.id}",
        [
            ("kind", job.kind),
            ("state", job.state),
            ("attempts", f"{job.attempts}/{job.max_attempts}"),
            (
                "lease",
                f"{job.lease_owner} until {job.lease_expires_at}" if job.lease_owner else "-",
            ),
            ("args", job.args),
            ("result", job.result),
            ("error", job.error),
        ],
    )


def _flag_rows(flags: list[Any]) -> list[list[Any]]:
    return [
        [
            f.id,
            f.kind,
            f.state,
            f.severity,
            short(f.pair_digest) if f.pair_id else f"artifact {f.artifact_id}",
            f"{f.opened_at:%Y-%m-%d %H:%M:%S}",
            f.summary,
        ]
        for f in flags
    ]


@drift_app.command("list")
def drift_list(
    state: str | None = typer.Option(None, "--state", help="open|acknowledged|resolved"),
    kind: str | None = typer.Option(None, "--kind", help="drift|integrity|workload|serving"),
    pair: str | None = typer.Option(None, "--pair"),
    json_out: bool = JSON,
) -> None:
    page = get_backend().list_flags(state=state, kind=kind, pair=pair)
    if json_out:
        print_json(page)
        return
    table(
        "flags",
        ["id", "kind", "state", "severity", "subject", "opened", "summary"],
        _flag_rows(page.items),
    )


@drift_app.command("show")
def drift_show(id: int = typer.Argument(...), json_out: bool = JSON) -> None:
    flag = get_backend().get_flag(id=id)
    if json_out:
        print_json(flag)
        return
    kv(
        f"flag {flag.id} ({flag.kind})",
        [
            ("state", flag.state),
            ("severity", flag.severity),
            ("pair", flag.pair_digest),
            ("artifact", flag.artifact_id),
            ("baseline measurement", flag.baseline_measurement_id),
            ("candidate measurement", flag.candidate_measurement_id),
            ("summary", flag.summary),
            ("opened", f"{flag.opened_at:%Y-%m-%d %H:%M:%S} by {flag.opened_by}"),
            (
                "closed",
                f"{flag.closed_at:%Y-%m-%d %H:%M:%S} by {flag.closed_by}: {flag.reason}"
                if flag.closed_at
                else "-",
            ),
        ],
    )
    cats = (flag.effects or {}).get("categories") or {}
    if cats:
        table(
            "per category (candidate − baseline)",
            ["category", "prompts", "α base", "α cand", "diff", "95% CI", "p", "Holm p", "drift"],
            [
                [
                    c,
                    e["prompts"],
                    _f(e["baseline_alpha"]),
                    _f(e["candidate_alpha"]),
                    _f(e["diff"], "+.3f"),
                    f"[{_f(e['ci_low'], '+.3f')}, {_f(e['ci_high'], '+.3f')}]",
                    _f(e["p_value"], ".4f"),
                    _f(e["p_holm"], ".4f"),
                    "yes" if e["drifted"] else "",
                ]
                for c, e in sorted(cats.items())
            ],
        )
    tf = (flag.effects or {}).get("teacher_forced")
    if tf:
        kv("teacher-forced mean Σmin(p,q)", sorted(tf.items()))


def _f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


@drift_app.command("ack")
def drift_ack(
    id: int = typer.Argument(...),
    reason: str = typer.Option(..., "--reason"),
    json_out: bool = JSON,
) -> None:
    """Acknowledge a flag with a reason: it stops blocking promotion (audited)."""
    flag = get_backend().ack_flag(id=id, reason=reason)
    if json_out:
        print_json(flag)
    else:
        console.print(f"flag {flag.id} acknowledged by {flag.closed_by}")


@drift_app.command("resolve")
def drift_resolve(
    id: int = typer.Argument(...),
    reason: str = typer.Option(..., "--reason"),
    json_out: bool = JSON,
) -> None:
    """Close a flag whose cause is fixed."""
    flag = get_backend().resolve_flag(id=id, reason=reason)
    if json_out:
        print_json(flag)
    else:
        console.print(f"flag {flag.id} resolved by {flag.closed_by}")


@measurement_app.command("list")
def measurement_list(
    pair: str | None = typer.Option(None, "--pair"), json_out: bool = JSON
) -> None:
    page = get_backend().list_measurements(pair=pair)
    if json_out:
        print_json(page)
        return
    table(
        "measurements",
        ["id", "pair", "suite", "α", "runner", "device", "MLflow run", "created"],
        [
            [
                m.id,
                short(m.pair_digest),
                m.suite_name,
                _f(m.alpha),
                m.runner_version,
                m.device,
                m.mlflow_run_id,
                f"{m.created_at:%Y-%m-%d %H:%M:%S}",
            ]
            for m in page.items
        ],
    )


@measurement_app.command("show")
def measurement_show(id: int = typer.Argument(...), json_out: bool = JSON) -> None:
    m = get_backend().get_measurement(id=id)
    if json_out:
        print_json(m)
        return
    console.print(
        f"measurement {m.id} of pair {m.pair_digest} on {m.suite_name} "
        f"({short(m.suite_digest)}), runner {m.runner_version}"
    )
    measure_cli.render_categories(m.categories, m.overall)
    signed = f", signed by {m.signature['key']}" if m.signature else ", unsigned"
    console.print(
        f"produced via {m.produced_via} by {m.created_by}"
        + (f" (job {m.job_id})" if m.job_id else "")
        + signed,
        highlight=False,
        markup=False,
    )


@measurement_app.command("verify")
def measurement_verify(
    id: int | None = typer.Argument(None, help="Measurement id (asks the registry)."),
    file: Path | None = typer.Option(
        None, "--file", help="Offline: a `measurement show --json` record instead of an id."
    ),
    key: str | None = typer.Option(
        None, "--key", help="Offline: the worker's public key (64 hex or a PEM file path)."
    ),
    json_out: bool = JSON,
) -> None:
    """Verify a measurement's worker signature (by id, or offline from a file and a key)."""
    if file is not None:
        if not key:
            raise InvalidInput("--file needs --key: the worker's public key", field="key")
        key_text = Path(key).read_text() if Path(key).is_file() else key
        try:
            record = json.loads(Path(file).read_text())
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot read {file}: {exc}", field="file") from exc
        problems = verify_record(record, key_text)
        if json_out:
            print_json({"ok": not problems, "problems": problems})
        elif problems:
            err_console.print("NOT verified: " + "; ".join(problems), markup=False)
        else:
            console.print(f"verified: measurement {record.get('id')} signed by this key")
        if problems:
            raise typer.Exit(1)
        return
    if id is None:
        raise InvalidInput("give a measurement id, or --file and --key", field="id")
    out = get_backend().verify_measurement(id=id)
    if json_out:
        print_json(out)
    elif out.ok:
        console.print(f"verified: measurement {id} signed by {out.key} ({out.token_name})")
    else:
        err_console.print("NOT verified: " + "; ".join(out.problems), markup=False)
    if not out.ok:
        raise typer.Exit(1)


worker_key_app = typer.Typer(
    no_args_is_help=True, help="Worker signing keys (admin registers, anyone verifies)."
)


@worker_key_app.command("add")
def worker_key_add(
    token: str = typer.Argument(..., help="The worker token's name."),
    public_key: str = typer.Argument(..., help="64 hex characters, or a PEM file path."),
    json_out: bool = JSON,
) -> None:
    """Register the Ed25519 public key a worker signs its results with."""
    text = Path(public_key).read_text() if Path(public_key).is_file() else public_key
    out = get_backend().register_worker_key(token=token, public_key=text)
    if json_out:
        print_json(out)
        return
    console.print(f"key {out.fingerprint} registered for worker token {out.token_name}")


@worker_key_app.command("list")
def worker_key_list(
    token: str | None = typer.Option(None, "--token"), json_out: bool = JSON
) -> None:
    keys = get_backend().list_worker_keys(token=token)
    if json_out:
        print_json(keys)
        return
    table(
        "worker keys",
        ["fingerprint", "token", "public key", "revoked"],
        [[k.fingerprint, k.token_name, k.public_key, k.revoked_at or ""] for k in keys],
    )


def watch(
    lineage: str | None = typer.Option(None, "--lineage", help="Only this lineage."),
    json_out: bool = JSON,
) -> None:
    """Poll Hub branches of watched lineages once; register new commits."""
    results = get_backend().watch(lineage=lineage)
    if json_out:
        print_json(results)
        return
    table(
        "watch",
        ["lineage", "source", "was", "now", "registered", "error"],
        [
            [
                r.lineage,
                r.source,
                short(r.previous_commit),
                short(r.current_commit),
                "yes" if r.registered else "",
                r.error,
            ]
            for r in results
        ],
    )


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("promote")(promote)
    app.command("rollback")(rollback)
    app.command("measure")(measure_cli.measure)
    app.command("watch")(watch)
    worker_cli.register(app)
    app.add_typer(deployment_app, name="deployment")
    app.add_typer(policy_app, name="policy")
    app.add_typer(jobs_app, name="jobs")
    app.add_typer(drift_app, name="drift")
    app.add_typer(measurement_app, name="measurement")
    app.add_typer(worker_key_app, name="worker-key")
