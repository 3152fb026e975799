"""Validation: measure a pair on its policy's suite (reusing a stored measurement when the
pair, suite, settings and runner version all match), then evaluate every gate.

Gates (each a row with what was required and what was measured):

* ``alpha.overall`` and ``alpha.<category>``: acceptance floors.
* ``lossless``: a strict (lossless) acceptance rule, unless the policy allows lossy pairs;
  then ``lossy.adversarial``: at most ``max_divergence_rate`` of the adversarial prompts
  may diverge from the target's own greedy answer within the first ``first_tokens`` tokens.
* ``provenance``: required provenance fields present on the target and the drafter.
* ``signature``: with ``provenance.require_signature`` or ``allowed_signers``, both parts
  carry a verified OpenSSF model signature from an allowed signer.
* ``declared_target``: the drafter's own record of its intended target names this target.
* ``alpha.max_drop``: α may fall at most ``max_drop`` below the deployment's live pair.
* ``serving_config``: the measurement ran under the serving configuration the deployment
  serves (method, k, dtype, acceptance rule, the target's chat-template digest, an EAGLE-3
  head's auxiliary layer ids: :mod:`registry.services.serving`).
* ``flags``: no open drift, integrity, workload or serving flag on the pair or its
  artifacts.
* ``economics.speedup.b<N>``, ``economics.cost``, ``economics.draft_memory``: with an
  ``[economics]`` section, the predicted speed-up at each batch of ``min_speedup`` (the
  batch must also fit in memory with the drafter), the cost per 1M emitted tokens at those
  batches, and the drafter's share of memory, on the named hardware profile, from this
  measurement's τ (:mod:`registry.services.economics`).

The same function runs again inside the promoting transaction, so a promotion always sees
the gates as they stand at that moment (a flag opened since validation blocks it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from registry.errors import InvalidInput, NotFound, PairregError
from registry.governance import lifecycle, roles
from registry.governance.policy import (
    MEASURING_ENGINES,
    applicable_policy_name,
    category_floor,
    economics_gated,
    measurement_settings,
    measuring_engine,
    remote_code_parts,
    section,
    settings_digest,
)
from registry.params import Cursor, Id, Limit
from registry.records.core import Page, from_row
from registry.records.governance import GateResult, ValidateResult, ValidationRecord
from registry.refs import resolve_deployment, resolve_pair
from registry.services import jobs as jobs_service
from registry.services.base import page_query
from registry.services.duties import approved_digests, check_result_signature
from registry.services.measurements import find_reusable, insert_measurement
from registry.services.policies import _store as store_policy
from registry.services.policies import load_policy
from registry.services.serving import serving_config_gate
from registry.services.tokens import require_duty
from registry.tables import Deployment, DriftFlag, Job, Measurement, Pair, Policy, Validation
from registry.trust.audit import append_event
from registry.trust.measurement_signing import statement
from registry.trust.model_signature import signer_refusal

DECLARED_TARGET_WARNING = "drafter declares intended target"
POLICY_TEXT_RULE = "policy text is stored only by policy authors"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def open_flags(session: Session, pair: Pair) -> list[DriftFlag]:
    """Open flags that block this pair: on the pair itself, or integrity flags on its parts."""
    artifact_ids = [pair.target_id] + ([pair.drafter_id] if pair.drafter_id else [])
    stmt = select(DriftFlag).where(
        DriftFlag.state == "open",
        or_(DriftFlag.pair_id == pair.id, DriftFlag.artifact_id.in_(artifact_ids)),
    )
    return list(session.scalars(stmt.order_by(DriftFlag.id)))


def _divergence_gate(policy: dict[str, Any], m: Measurement) -> GateResult:
    lossy = policy["lossy"]
    cats = set(lossy["adversarial_categories"])
    n = int(lossy["first_tokens"])
    rows = [p for p in m.prompts if p.get("category") in cats]
    required = f"<= {lossy['max_divergence_rate']:.4f} diverging in first {n} tokens"
    if not rows:
        return GateResult(
            name="lossy.adversarial",
            required=required,
            measured="no prompts",
            passed=False,
            detail="the suite has no prompts in " + ", ".join(sorted(cats)),
        )
    if any("divergence_at" not in p for p in rows):
        return GateResult(
            name="lossy.adversarial",
            required=required,
            measured="no divergence data",
            passed=False,
            detail="the measurement did not compare outputs with plain greedy",
        )
    diverged = sum(1 for p in rows if p["divergence_at"] is not None and p["divergence_at"] < n)
    rate = diverged / len(rows)
    return GateResult(
        name="lossy.adversarial",
        required=required,
        measured=f"{rate:.4f} ({diverged}/{len(rows)})",
        passed=rate <= lossy["max_divergence_rate"],
    )


def signature_gate(policy: dict[str, Any], pair: Pair) -> GateResult | None:
    """``signature``: the target and the drafter carry a verified model signature from an
    allowed signer, when the policy asks for signatures or names signers (else no gate)."""
    prov = policy["provenance"]
    require, allowed = prov["require_signature"], prov["allowed_signers"]
    if not require and not allowed:
        return None
    parts = [("target", pair.target)] + ([("drafter", pair.drafter)] if pair.drafter else [])
    refusals, signers = [], []
    for role, art in parts:
        why = signer_refusal(
            art.signature, require=require, allowed=allowed, trusted_roots=prov["trusted_roots"]
        )
        if why is not None:
            refusals.append(f"{role} {art.lineage}@v{art.version}: {why}")
        elif art.signature is not None:
            signers.append(f"{role} by {art.signature['signer']}")
    wanted = "signed" if require else "if signed"
    if allowed:
        wanted += " by " + ", ".join(allowed)
    return GateResult(
        name="signature",
        required=wanted,
        measured="; ".join(refusals) if refusals else ("; ".join(signers) or "no signatures"),
        passed=not refusals,
    )


def economics_gates(
    session: Session,
    pair: Pair,
    policy: dict[str, Any],
    m: Measurement,
    home_dir: str | None = None,
) -> list[GateResult]:
    """The ``[economics]`` gates (none when the policy sets none), on the policy's hardware
    profile: shipped, or in ``home_dir`` (the serving process's home, from the operation's
    context; None: shipped only)."""
    if not economics_gated(policy):
        return []
    from registry.economics.hardware import get_profile
    from registry.economics.model import DEFAULT_MEMORY_FRACTION
    from registry.services.economics import build_report

    econ = policy["economics"]
    floors = {int(b): float(v) for b, v in econ["min_speedup"].items()}
    where = f"on {econ['hardware']} at context {econ['context']}"
    try:
        report = build_report(
            session,
            pair,
            profile=get_profile(econ["hardware"], home_dir),
            batches=sorted(floors) or [1],
            context=int(econ["context"]),
            price=econ["price_per_hour"] or None,
            memory_fraction=DEFAULT_MEMORY_FRACTION,
            measurement=m,
        )
    except PairregError as exc:
        return [
            GateResult(
                name="economics",
                required="pair economics computable " + where,
                measured="unavailable",
                passed=False,
                detail=str(exc),
            )
        ]
    gates: list[GateResult] = []
    for pt in report.points:
        if pt.batch not in floors:
            continue
        fits = "" if pt.fits else f" (does not fit: max batch {report.max_batch_spec})"
        gates.append(
            GateResult(
                name=f"economics.speedup.b{pt.batch}",
                required=f">= {floors[pt.batch]:.3f} {where}",
                measured=f"{pt.speedup:.3f}{fits}",
                passed=pt.fits and pt.speedup >= floors[pt.batch],
                detail=f"predicted from τ {report.tau:.3f} ({report.tau_source})",
            )
        )
    ceiling = econ["max_cost_per_million_tokens"]
    if ceiling:
        costs = [(pt.batch, pt.cost_per_million_emitted) for pt in report.points]
        worst = max((c for _, c in costs if c is not None), default=None)
        gates.append(
            GateResult(
                name="economics.cost",
                required=f"<= {ceiling:.4f} per 1M emitted tokens {where}",
                measured="no price per hour"
                if worst is None
                else ", ".join(f"b{b}: {c:.4f}" for b, c in costs if c is not None),
                passed=worst is not None and worst <= ceiling,
                detail=None
                if worst is not None
                else "set economics.price_per_hour or a profile price",
            )
        )
    frac = econ["max_draft_memory_fraction"]
    if frac:
        gates.append(
            GateResult(
                name="economics.draft_memory",
                required=f"<= {frac:.4f} of memory {where}",
                measured=f"{report.draft_memory_fraction:.4f}",
                passed=report.draft_memory_fraction <= frac,
                detail=f"max batch {report.max_batch_spec} with the drafter, "
                f"{report.max_batch_plain} without",
            )
        )
    return gates


def baseline_measurement(
    session: Session, deployment: Deployment | None, pair: Pair, policy: Policy
) -> Measurement | None:
    """The measurement behind the live pair's latest passing validation under this policy."""
    if deployment is None or deployment.current_pair_id in (None, pair.id):
        return None
    val = session.scalar(
        select(Validation)
        .where(
            Validation.pair_id == deployment.current_pair_id,
            Validation.policy_name == policy.name,
            Validation.passed.is_(True),
        )
        .order_by(Validation.id.desc())
        .limit(1)
    )
    if val is None or val.measurement_id is None:
        return None
    return session.get(Measurement, val.measurement_id)


def policy_settings(session: Session, pair: Pair, pol: Policy) -> dict[str, Any]:
    """The runner settings ``pair`` is measured with under ``pol``; refuses a part whose
    model code is not in transformers unless an admin approved its exact bytes."""
    parts = [("target", pair.target.lineage, pair.target.facts, pair.target.manifest_digest)]
    if pair.drafter is not None:
        d = pair.drafter
        parts.append(("drafter", d.lineage, d.facts, d.manifest_digest))
    approved = approved_digests(session, [p[3] for p in parts if (p[2] or {}).get("remote_code")])
    refused, needed = remote_code_parts(parts, approved)
    if refused:
        raise InvalidInput("; ".join(refused), field="ref")
    overrides = {"trust_remote_code": True} if needed else None
    return measurement_settings(pair.config, pol.parsed["suite"], overrides=overrides)


_VIA_WORDS = {
    "job": "measured by a worker under a job",
    "local": "measured by the embedded registry's own user",
    "http": "self-reported over HTTP",
}


def trust_gate(policy: dict[str, Any], m: Measurement) -> GateResult:
    """``measurement.trust``: the measurement was produced as the policy's ``[trust]``
    accepts (by default a worker under a job or the embedded registry's own user; a
    self-reported result over HTTP never opens a gate unless the policy says so)."""
    trust = section(policy, "trust")
    accepted = list(trust["measurements"])
    ok = m.produced_via in accepted
    required = "produced via " + " or ".join(accepted)
    if trust["require_signature"]:
        required += ", signed by a registered worker key"
        ok = ok and m.signature is not None
    engines = list(trust["engines"])
    engine = measuring_engine(m.extra)
    restricted = set(engines) != set(MEASURING_ENGINES)
    if restricted:
        required += ", measured on " + " or ".join(engines)
    ok = ok and engine in engines
    signed = f", signed by {m.signature['key']}" if m.signature else ""
    if restricted or engine != "runner":
        signed += f", on {engine}"
    return GateResult(
        name="measurement.trust",
        required=required,
        measured=f"{m.produced_via}{signed}",
        passed=ok,
        detail=f"measurement {m.id}: {_VIA_WORDS.get(m.produced_via, m.produced_via)} "
        f"by {m.created_by}" + (f" (job {m.job_id})" if m.job_id else ""),
    )


def evaluate_gates(
    session: Session,
    pair: Pair,
    policy: Policy,
    m: Measurement,
    *,
    baseline: Measurement | None = None,
    home_dir: str | None = None,
) -> list[GateResult]:
    p = policy.parsed
    gates: list[GateResult] = [trust_gate(p, m)]
    gates.append(
        GateResult(
            name="alpha.overall",
            required=f">= {p['alpha']['min_overall']:.4f}",
            measured=_fmt(m.alpha),
            passed=m.alpha is not None and m.alpha >= p["alpha"]["min_overall"],
        )
    )
    wanted = p["suite"]["categories"] or sorted(m.categories)
    for cat in wanted:
        floor = category_floor(p, cat)
        alpha = (m.categories.get(cat) or {}).get("alpha")
        gates.append(
            GateResult(
                name=f"alpha.{cat}",
                required=f">= {floor:.4f}",
                measured=_fmt(alpha),
                passed=alpha is not None and alpha >= floor,
                detail=None if cat in m.categories else "category missing from the measurement",
            )
        )
    if baseline is not None:
        drop = None if m.alpha is None or baseline.alpha is None else baseline.alpha - m.alpha
        gates.append(
            GateResult(
                name="alpha.max_drop",
                required=f"drop <= {p['alpha']['max_drop']:.4f}",
                measured=_fmt(drop),
                passed=drop is not None and drop <= p["alpha"]["max_drop"],
                detail=f"against measurement {baseline.id} of the live pair",
            )
        )
    if p["lossy"]["allowed"]:
        gates.append(
            GateResult(
                name="lossless",
                required="strict or an allowed lossy rule",
                measured="lossy" if pair.lossy else "lossless",
                passed=True,
            )
        )
        if pair.lossy:
            gates.append(_divergence_gate(p, m))
    else:
        gates.append(
            GateResult(
                name="lossless",
                required="lossless (strict acceptance)",
                measured="lossy" if pair.lossy else "lossless",
                passed=not pair.lossy,
            )
        )
    required = list(p["provenance"]["required"])
    if required:
        missing = [f"target.{f}" for f in required if not (pair.target.provenance or {}).get(f)]
        if pair.drafter is not None:
            missing += [
                f"drafter.{f}" for f in required if not (pair.drafter.provenance or {}).get(f)
            ]
        gates.append(
            GateResult(
                name="provenance",
                required=", ".join(required),
                measured="complete" if not missing else "missing " + ", ".join(missing),
                passed=not missing,
            )
        )
    sig_gate = signature_gate(p, pair)
    if sig_gate is not None:
        gates.append(sig_gate)
    if p["drafter"]["declared_target_must_match"]:
        mismatch = [w for w in pair.warnings if w.startswith(DECLARED_TARGET_WARNING)]
        gates.append(
            GateResult(
                name="declared_target",
                required="drafter names this target",
                measured="mismatch" if mismatch else "match",
                passed=not mismatch,
                detail=mismatch[0] if mismatch else None,
            )
        )
    gates += economics_gates(session, pair, p, m, home_dir)
    gates.append(serving_config_gate(pair, m))
    flags = open_flags(session, pair)
    gates.append(
        GateResult(
            name="flags",
            required="no open drift or integrity flag",
            measured="none" if not flags else ", ".join(f"#{f.id} {f.kind}" for f in flags),
            passed=not flags,
            detail="; ".join(f.summary for f in flags) or None,
        )
    )
    return gates


def to_record(row: Validation, pair_digest: str) -> ValidationRecord:
    return from_row(ValidationRecord, row, pair_digest=pair_digest)


def record_validation(
    session: Session,
    pair: Pair,
    policy: Policy,
    m: Measurement,
    *,
    deployment: Deployment | None,
    actor: str,
    home_dir: str | None = None,
) -> Validation:
    gates = evaluate_gates(
        session,
        pair,
        policy,
        m,
        baseline=baseline_measurement(session, deployment, pair, policy),
        home_dir=home_dir,
    )
    passed = all(g.passed for g in gates)
    row = Validation(
        pair_id=pair.id,
        policy_id=policy.id,
        policy_name=policy.name,
        policy_digest=policy.digest,
        measurement_id=m.id,
        deployment=deployment.name if deployment else None,
        gates=[g.model_dump() for g in gates],
        passed=passed,
        actor=actor,
    )
    session.add(row)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="pair.validation",
        entity_type="pair",
        entity_id=pair.id,
        payload={
            "validation_id": row.id,
            "pair_digest": pair.pair_digest,
            "policy": policy.name,
            "policy_digest": policy.digest,
            "measurement_id": m.id,
            "passed": passed,
            "failed_gates": [g.name for g in gates if not g.passed],
        },
    )
    if passed and lifecycle.allowed(pair.status, "validated"):
        lifecycle.apply(
            session,
            pair,
            "validated",
            actor=actor,
            reason=f"passed policy {policy.name} (validation {row.id})",
        )
    if passed:
        from registry.services.drift import resolve_by_retrained  # drift imports this module

        resolve_by_retrained(session, pair, row.id, actor, home_dir)
    return row


def _deployment(session: Session, name: str | None) -> Deployment | None:
    return resolve_deployment(session, name) if name else None


def measure_job_args(
    pair: Pair,
    policy: Policy,
    settings: dict[str, Any],
    *,
    runner_version: str | None,
    suite_digest: str | None,
    validate: dict[str, Any] | None = None,
    drift: dict[str, Any] | None = None,
) -> dict[str, Any]:
    suite = policy.parsed["suite"]
    return {
        "pair_id": pair.id,
        "pair_digest": pair.pair_digest,
        "suite_name": suite["name"],
        "categories": list(suite["categories"]),
        "prompts_per_category": suite["prompts_per_category"],
        "settings": settings,
        "runner_version": runner_version,
        "suite_digest": suite_digest,
        "policy": policy.name,
        "validate": validate,
        "drift": drift,
    }


def measure_key(pair: Pair, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "pair": pair.pair_digest,
        "suite": args["suite_name"],
        "categories": args["categories"],
        "prompts_per_category": args["prompts_per_category"],
        "settings": args["settings"],
        "runner_version": args["runner_version"],
        "suite_digest": args["suite_digest"],
        "purpose": "drift" if args.get("drift") else "validate",
        "policy": args["policy"],
    }


def validate_pair(
    session: Session,
    *,
    ref: str,
    policy: Annotated[
        str | None, Field(description="Policy name (default: the deployment's, else `default`).")
    ] = None,
    policy_text: Annotated[
        str | None, Field(max_length=100_000, description="A policy TOML to store and use.")
    ] = None,
    deployment: str | None = None,
    runner_version: Annotated[
        str | None,
        Field(
            max_length=64,
            description="The caller measures itself with this runner version (embedded CLI).",
        ),
    ] = None,
    suite_digest: Annotated[str | None, Field(max_length=64)] = None,
    device: Annotated[
        Literal["cpu", "cuda"] | None, Field(description="Only a worker on this device measures.")
    ] = None,
    actor: str,
    home_dir: str | None = None,
) -> ValidateResult:
    """Validate now from a matching stored measurement, or queue the measurement job.

    The policy is ``policy_text`` (stored first), else ``policy`` by name, else the
    deployment's policy, else ``default``. ``runner_version``/``suite_digest`` name what the
    caller's runner would measure with; when given, only a measurement that matches them is
    reused. ``home_dir`` (from the operation's context) holds the serving process's
    hardware profiles for the economics gates.
    """
    pair = resolve_pair(session, ref)
    dep = _deployment(session, deployment)
    if policy_text is not None:
        # Policy text is stored only by policy authors, wherever it arrives: a registrar
        # must not lower the floors its own pair is validated against.
        require_duty(
            session, actor, roles.AUTHOR_POLICY, rule=POLICY_TEXT_RULE, field="policy_text"
        )
        pol, _ = store_policy(session, policy_text, None, actor)
    else:
        asked = applicable_policy_name(policy, dep.policy_name if dep else None)
        pol = load_policy(session, asked, actor=actor)
    if dep is not None and dep.policy_name != pol.name:
        raise InvalidInput(
            f"deployment {dep.name} enforces policy {dep.policy_name}, not {pol.name}",
            field="policy",
        )
    settings = policy_settings(session, pair, pol)
    versions = (
        [runner_version]
        if runner_version
        else jobs_service.measuring_runner_versions(session, device)
    )
    m = (
        find_reusable(
            session,
            pair,
            suite_name=pol.parsed["suite"]["name"],
            settings=settings,
            suite_digest=suite_digest,
            runner_versions=versions,
            trust=section(pol.parsed, "trust"),
        )
        if versions
        else None
    )
    if m is not None:
        val = record_validation(
            session, pair, pol, m, deployment=dep, actor=actor, home_dir=home_dir
        )
        return ValidateResult(
            state="done", validation=to_record(val, pair.pair_digest), pair_status=pair.status
        )
    args = measure_job_args(
        pair,
        pol,
        settings,
        runner_version=runner_version,
        suite_digest=suite_digest,
        validate={"policy": pol.name, "deployment": deployment},
    )
    job, _ = jobs_service.enqueue(
        session,
        kind="measure",
        args=args,
        key_material=measure_key(pair, args),
        actor=actor,
        device=device,
    )
    return ValidateResult(state="queued", job=jobs_service.to_record(job), pair_status=pair.status)


def complete_measure(
    session: Session,
    job: Job,
    result: dict[str, Any],
    actor: str,
    home_dir: str | None = None,
) -> dict[str, Any]:
    """A measure job finished: store the numbers, then its follow-ups (drift, validation;
    ``home_dir`` for the economics gates' hardware profiles)."""
    from registry.services import drift as drift_service  # drift imports this module

    args = job.args
    pair = session.get(Pair, args["pair_id"])
    if pair is None:
        raise NotFound(f"job {job.id}: pair {args['pair_id']} no longer exists")
    for key in ("result", "suite_digest", "runner_version"):
        if key not in result:
            raise InvalidInput(f"job result lacks {key!r}", field=key)
    settings = result.get("settings") or args["settings"]
    signature = None
    if result.get("signature") is not None:
        expected = statement(
            pair_digest=pair.pair_digest,
            job_id=job.id,
            suite_name=args["suite_name"],
            suite_digest=result["suite_digest"],
            settings_digest=settings_digest(settings),
            runner_version=result["runner_version"],
            result=result["result"] if isinstance(result["result"], dict) else {},
        )
        signature = check_result_signature(session, actor, result["signature"], expected)
    m = insert_measurement(
        session,
        pair=pair,
        suite_name=args["suite_name"],
        suite_digest=result["suite_digest"],
        settings=settings,
        runner_version=result["runner_version"],
        result=result["result"],
        mlflow_run_id=result.get("mlflow_run_id"),
        device=result.get("device"),
        job_id=job.id,
        actor=actor,
        produced_via="job",
        signature=signature,
    )
    outcome: dict[str, Any] = {"measurement_id": m.id, "alpha": m.alpha}
    if args.get("drift"):
        check = drift_service.compare_for_drift(
            session,
            candidate=pair,
            candidate_measurement=m,
            baseline_measurement_id=int(args["drift"]["baseline_measurement_id"]),
            policy_name=args["policy"],
            teacher_forced=result.get("teacher_forced"),
            actor=actor,
        )
        outcome["flag_id"] = check.flag.id if check.flag else None
    follow = args.get("validate") or (
        {"policy": args["policy"], "deployment": None} if args.get("drift") else None
    )
    if follow:
        pol = load_policy(session, follow["policy"], actor=actor)
        dep = _deployment(session, follow.get("deployment"))
        val = record_validation(
            session, pair, pol, m, deployment=dep, actor=actor, home_dir=home_dir
        )
        outcome["validation_id"] = val.id
        outcome["passed"] = val.passed
    return outcome


def get_validation(session: Session, *, id: Id) -> ValidationRecord:
    row = session.get(Validation, id)
    if row is None:
        raise NotFound(f"no validation with id {id}", field="id")
    pair = session.get(Pair, row.pair_id)
    assert pair is not None
    return to_record(row, pair.pair_digest)


def set_validation_run(
    session: Session,
    *,
    id: Id,
    mlflow_run_id: Annotated[str, Field(min_length=1, max_length=64)],
    actor: str,
) -> ValidationRecord:
    """Attach the MLflow run the CLI/worker logged for a validation (once)."""
    row = session.get(Validation, id)
    if row is None:
        raise NotFound(f"no validation with id {id}", field="id")
    if row.mlflow_run_id and row.mlflow_run_id != mlflow_run_id:
        raise InvalidInput(
            f"validation {id} already has MLflow run {row.mlflow_run_id}", field="mlflow_run_id"
        )
    row.mlflow_run_id = mlflow_run_id
    append_event(
        session,
        actor=actor,
        action="validation.mlflow_run",
        entity_type="validation",
        entity_id=id,
        payload={"mlflow_run_id": mlflow_run_id},
    )
    pair = session.get(Pair, row.pair_id)
    assert pair is not None
    return to_record(row, pair.pair_digest)


def list_validations(
    session: Session,
    *,
    pair: str | None = None,
    policy: str | None = None,
    without_mlflow_run: bool = False,
    cursor: Cursor = None,
    limit: Limit = 100,
) -> Page[ValidationRecord]:
    stmt = select(Validation)
    if without_mlflow_run:  # workers attach runs to validations nobody logged yet
        stmt = stmt.where(Validation.mlflow_run_id.is_(None))
    if pair:
        stmt = stmt.where(Validation.pair_id == resolve_pair(session, pair).id)
    if policy:
        stmt = stmt.where(Validation.policy_name == policy)
    rows, next_cursor = page_query(session, stmt, Validation.id, cursor, limit)
    digests = {
        p.id: p.pair_digest
        for p in session.scalars(select(Pair).where(Pair.id.in_({r.pair_id for r in rows})))
    }
    return Page[ValidationRecord](
        items=[to_record(r, digests[r.pair_id]) for r in rows], next_cursor=next_cursor
    )
