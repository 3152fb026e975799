"""Serving telemetry: vLLM's spec-decode counters, online acceptance, workload drift flags.

vLLM exports cumulative Prometheus counters (``vllm:spec_decode_num_drafts``,
``…_num_draft_tokens``, ``…_num_accepted_tokens``, ``…_num_accepted_tokens_per_pos``), labelled
only by model name and engine: nothing in them names the draft, so each scrape is stored
against the deployment and the pair live on it *at scrape time*.

Each scrape stores the counters and the deltas from the previous scrape of that deployment
(a counter that went down means the engine restarted: the delta is the new value). The first
scrape only sets the reference point. Online acceptance is ``accepted / draft tokens`` summed
over the scrapes since the live pair went live: vLLM's ``draft_acceptance_rate``, which is
the same ratio the runner records as a measurement's ``draft_acceptance_rate`` (not α).

Workload drift: once at least ``min_drafted`` draft tokens were seen, an online rate below
the validated baseline by more than the deployment policy's ``[drift] margin`` opens a
``workload`` flag on the pair (one open flag at a time) in the governance flag table. The
pair's weights did not change; the traffic did.

With what the engine reports about itself (its ``/v1/models`` card and ``/version``, which
``pairreg telemetry scrape`` reads beside ``/metrics``), the same scrape checks that the
engine serves the live pair as exported (registry/services/serving.py): a difference opens
a ``serving`` flag naming each field.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.errors import InvalidInput
from registry.records.requests import TelemetryResult
from registry.refs import resolve_deployment
from registry.services import serving
from registry.services.drift import open_flag
from registry.services.policies import policy_in_force
from registry.tables import (
    DeploymentEvent,
    DriftFlag,
    Measurement,
    Pair,
    TelemetrySample,
    Validation,
)
from registry.trust.audit import lock_writes

COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
DEFAULT_MARGIN = 0.05
DEFAULT_MIN_DRAFTED = 1000


def metric_families(text: str) -> list[Any]:
    """The Prometheus text as ``prometheus_client`` metric families."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise InvalidInput(f"not Prometheus text format: {exc}", field="text") from exc


def parse_vllm_metrics(text: str, families: list[Any] | None = None) -> dict[str, Any]:
    """Sum vLLM's spec-decode counters over label sets (engines, model names).

    Uses ``prometheus_client``'s text parser; counters appear with the ``_total`` suffix in
    the exposition and without it as family names, and both spellings are accepted.
    """
    out: dict[str, Any] = {v: 0.0 for v in COUNTERS.values()}
    per_pos: dict[str, float] = defaultdict(float)
    found = False
    for family in families if families is not None else metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in COUNTERS:
                out[COUNTERS[name]] += float(sample.value)
                found = True
            elif name == PER_POSITION:
                per_pos[str(sample.labels.get("position", "?"))] += float(sample.value)
                found = True
    if not found:
        raise InvalidInput(
            "no vllm:spec_decode_* counters in the metrics text (is speculative decoding on?)",
            field="text",
        )
    out["accepted_per_pos"] = dict(sorted(per_pos.items(), key=lambda kv: _pos_key(kv[0])))
    return out


def _pos_key(pos: str) -> tuple[int, str]:
    return (int(pos), "") if pos.isdigit() else (1 << 30, pos)


def _deltas(cur: dict[str, Any], prev: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    if prev is None:
        zero = {k: 0.0 for k in COUNTERS.values()}
        zero["accepted_per_pos"] = {p: 0.0 for p in cur["accepted_per_pos"]}
        return zero, False
    reset = any(cur[k] < prev.get(k, 0.0) for k in COUNTERS.values())
    base = {k: 0.0 for k in COUNTERS.values()} if reset else prev
    out: dict[str, Any] = {k: cur[k] - base.get(k, 0.0) for k in COUNTERS.values()}
    prev_pos = {} if reset else prev.get("accepted_per_pos", {})
    out["accepted_per_pos"] = {
        p: v - prev_pos.get(p, 0.0) for p, v in cur["accepted_per_pos"].items()
    }
    return out, reset


def baseline_acceptance(session: Session, deployment_id: int, pair_id: int) -> float | None:
    """accepted/drafted of the measurement behind the validation that made the pair live
    (else the pair's newest measurement)."""
    ev = session.scalar(
        select(DeploymentEvent)
        .where(DeploymentEvent.deployment_id == deployment_id)
        .order_by(DeploymentEvent.seq.desc())
        .limit(1)
    )
    m = None
    if ev is not None and ev.to_pair_id == pair_id and ev.validation_id:
        val = session.get(Validation, ev.validation_id)
        if val is not None and val.measurement_id:
            m = session.get(Measurement, val.measurement_id)
    if m is None:
        m = session.scalar(
            select(Measurement)
            .where(Measurement.pair_id == pair_id)
            .order_by(Measurement.id.desc())
            .limit(1)
        )
    if m is None:
        return None
    rate = (m.overall or {}).get("draft_acceptance_rate")
    if rate is None:
        counters = (m.overall or {}).get("counters") or {}
        drafted, accepted = counters.get("drafted"), counters.get("accepted")
        rate = accepted / drafted if drafted else None
    return float(rate) if rate is not None else None


def _margin(session: Session, policy_name: str) -> float:
    pol = policy_in_force(session, policy_name)
    if pol is None:
        return DEFAULT_MARGIN
    return float(((pol.parsed or {}).get("drift") or {}).get("margin", DEFAULT_MARGIN))


def ingest_prometheus(
    session: Session,
    *,
    deployment: Annotated[str, Field(description="The deployment the scraped engine serves.")],
    text: Annotated[str, Field(description="Prometheus text exposition.")],
    source: Annotated[str, Field(max_length=500, description="Where the text came from.")] = "push",
    min_drafted: Annotated[
        int, Field(ge=1, le=2**40, description="Draft tokens needed before flagging.")
    ] = DEFAULT_MIN_DRAFTED,
    served_model: Annotated[
        str | None, Field(max_length=500, description="The engine's /v1/models `id`.")
    ] = None,
    served_root: Annotated[
        str | None,
        Field(max_length=2000, description="Its /v1/models `root` (model path or repo)."),
    ] = None,
    served_parent: Annotated[
        str | None, Field(max_length=2000, description="Its /v1/models `parent` (adapters).")
    ] = None,
    max_model_len: Annotated[
        int | None, Field(ge=1, le=2**31, description="Its /v1/models `max_model_len`.")
    ] = None,
    engine_version: Annotated[
        str | None, Field(max_length=100, description="The engine's /version.")
    ] = None,
    actor: str,
) -> TelemetryResult:
    """Store one scrape, update online acceptance, flag workload drift past the margin.

    With what the engine reports about itself (``served_*`` from ``/v1/models``,
    ``engine_version`` from ``/version``; ``pairreg telemetry scrape`` sends them), also
    check that it serves the live pair as exported: a difference opens a ``serving`` flag
    (registry/services/serving.py)."""
    if min_drafted < 1:
        raise InvalidInput("min_drafted must be at least 1", field="min_drafted")
    families = metric_families(text)
    counters = parse_vllm_metrics(text, families)
    lock_writes(session)  # deltas are read-then-write against the previous sample
    dep = resolve_deployment(session, deployment)
    prev = session.scalar(
        select(TelemetrySample)
        .where(TelemetrySample.deployment_id == dep.id)
        .order_by(TelemetrySample.id.desc())
        .limit(1)
    )
    deltas, reset = _deltas(counters, prev.counters if prev else None)
    pair_id = dep.current_pair_id
    sample = TelemetrySample(
        deployment_id=dep.id,
        pair_id=pair_id,
        source=source[:500],
        counters=counters,
        deltas=deltas,
        reset=reset,
        drafted=int(deltas["num_draft_tokens"]),
        accepted=int(deltas["num_accepted_tokens"]),
    )
    session.add(sample)
    session.flush()
    margin = _margin(session, dep.policy_name)
    result = TelemetryResult(
        deployment=dep.name,
        pair_digest=None,
        sample_id=sample.id,
        reset=reset,
        deltas=deltas,
        window_drafted=0,
        window_accepted=0,
        online_acceptance=None,
        baseline_acceptance=None,
        margin=margin,
        min_drafted=min_drafted,
        flagged=False,
    )
    if pair_id is None:
        return result
    pair = session.get(Pair, pair_id)
    assert pair is not None
    said: dict[str, Any] = {
        "served_model": served_model, "root": served_root, "parent": served_parent,
        "max_model_len": max_model_len, "engine_version": engine_version,
    }  # fmt: skip
    if served_model is not None or engine_version is not None:
        # a /v1/models card always has a root and a parent (null for a base model)
        fields = {k for k, v in said.items() if v is not None}
        if served_model is not None:
            fields |= {"root", "parent"}
        result.serving = serving.check_engine(
            session, dep, pair,
            serving.reported_engine(**said), reported_fields=fields, source=source[:500],
            actor=actor,
        )  # fmt: skip
    live_since = session.scalar(
        select(func.max(DeploymentEvent.at)).where(DeploymentEvent.deployment_id == dep.id)
    )
    window = select(
        func.coalesce(func.sum(TelemetrySample.drafted), 0),
        func.coalesce(func.sum(TelemetrySample.accepted), 0),
    ).where(TelemetrySample.deployment_id == dep.id, TelemetrySample.pair_id == pair_id)
    if live_since is not None:
        window = window.where(TelemetrySample.scraped_at >= live_since)
    drafted, accepted = (int(v) for v in session.execute(window).one())
    online = accepted / drafted if drafted else None
    baseline = baseline_acceptance(session, dep.id, pair_id)
    sample.online_acceptance = online
    sample.baseline_acceptance = baseline
    result.pair_digest = pair.pair_digest
    result.window_drafted, result.window_accepted = drafted, accepted
    result.online_acceptance, result.baseline_acceptance = online, baseline
    if (
        online is not None
        and baseline is not None
        and drafted >= min_drafted
        and online < baseline - margin
    ):
        flag = session.scalar(
            select(DriftFlag).where(
                DriftFlag.kind == "workload",
                DriftFlag.pair_id == pair_id,
                DriftFlag.state == "open",
            )
        )
        if flag is None:
            flag = _open_workload_flag(
                session, pair, dep.name, dep.policy_name, online, baseline, margin, drafted, actor
            )
        sample.drift_flag_id = flag.id
        result.flagged, result.flag_id = True, flag.id
    session.flush()
    return result


def _open_workload_flag(
    session: Session,
    pair: Pair,
    deployment: str,
    policy_name: str,
    online: float,
    baseline: float,
    margin: float,
    drafted: int,
    actor: str,
) -> DriftFlag:
    summary = (
        f"workload drift on {deployment}: online acceptance {online:.4f} over {drafted} draft "
        f"tokens is below the validated {baseline:.4f} by more than {margin:.4f}"
    )
    return open_flag(
        session,
        DriftFlag(
            kind="workload",
            pair_id=pair.id,
            policy_name=policy_name,
            effects={
                "deployment": deployment,
                "online_acceptance": online,
                "baseline_acceptance": baseline,
                "drop": baseline - online,
                "margin": margin,
                "window_draft_tokens": drafted,
                "metric": "accepted_tokens / draft_tokens (vLLM draft_acceptance_rate)",
            },
            severity="high" if baseline - online > 2 * margin else "medium",
            summary=summary,
        ),
        actor=actor,
        payload={"pair_digest": pair.pair_digest, "deployment": deployment, "summary": summary},
    )
