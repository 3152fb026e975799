"""What a deployment checks about how its live pair is served.

Three checks, one mapping (``pairreg export vllm DEPLOYMENT``'s: the target's Hub repo or
verified directory, the served name, vLLM's speculative method and k, the drafter, the
dtype):

* **Promotion and validation** (the ``serving_config`` gate): the measurement a pair is
  validated with records the serving configuration it ran under
  (``runner/serving_config.py``); it must be the one the deployment will serve: method,
  k, dtype, acceptance rule, the target's chat-template digest (when the target's files
  are at hand here) and, for EAGLE-3, the auxiliary layer ids of the head.
* **Export** (:func:`measured_aux_layer_ids`): vLLM does not report the layers an EAGLE-3
  head fuses, so the export carries those the validated measurement ran with and refuses
  a head whose config on disk says otherwise (vLLM #50170: a head served with the wrong
  layers accepted 1.2 % instead of 58.9 % of its drafts while the server stayed healthy).
* **Scrape** (:func:`check_engine`): what the engine reports about itself (``/v1/models``:
  served name, ``root``, ``parent``; ``/version``; vLLM 0.32 has no info gauge for its
  speculative or model config, only ``vllm:cache_config_info``, and its per-response
  ``system_fingerprint`` hashes the whole config without naming it) against the live pair
  as exported and
  the engine version of the measurement that validated it. A difference opens one
  ``serving`` flag on the live pair, naming each field (expected, reported); an engine
  version other than the validated one also queues a re-measurement of the live pair under
  the deployment's policy (the job a validation queues, once per version).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.artifacts.serving_config import (
    aux_layer_ids,
    chat_template_digest,
    declared_aux_layer_ids,
    default_aux_layer_ids,
)
from registry.errors import InvalidInput, PairregError
from registry.methods import get_method
from registry.records.governance import GateResult
from registry.records.requests import ServingCheck, ServingDifference
from registry.services.drift import open_flag
from registry.tables import (
    Artifact,
    Deployment,
    DeploymentEvent,
    DriftFlag,
    Measurement,
    Pair,
    Validation,
)

# the fields of a measurement's serving_config a deployment checks, in report order
CHECKED = ("method", "k", "dtype", "acceptance", "chat_template_digest", "eagle3_aux_layer_ids")


def _local_dir(art: Artifact) -> Path | None:
    if art.local_path and Path(art.local_path).is_dir():
        return Path(art.local_path)
    return None


def head_aux_layer_ids(pair: Pair) -> list[int] | None:
    """The layers the pair's EAGLE-3 head fuses as its files say (declared in its
    config.json, or recorded at registration), else the default for the target's layer
    count; None for other methods."""
    if not get_method(pair.method).fuses_target_layers or pair.drafter is None:
        return None
    local = _local_dir(pair.drafter)
    if local is not None:
        target = _local_dir(pair.target)
        ids = aux_layer_ids(local, target)
        if ids is not None:
            return ids
    spec = (pair.drafter.facts or {}).get("speculators") or {}
    if spec.get("aux_layer_ids"):
        return [int(i) for i in spec["aux_layer_ids"]]
    n = (pair.target.facts or {}).get("num_layers")
    return default_aux_layer_ids(int(n)) if isinstance(n, int) and n >= 3 else None


def expected_config(pair: Pair) -> dict[str, Any]:
    """The serving configuration the pair is served under as exported (the fields of a
    measurement's ``serving_config`` a deployment checks; None: not known here)."""
    cfg = pair.config or {}
    target = _local_dir(pair.target)
    return {
        "method": pair.method,
        "k": pair.k,
        "dtype": cfg.get("dtype", "float32"),
        "acceptance": cfg.get("acceptance", "strict"),
        "chat_template_digest": chat_template_digest(target) if target else None,
        "eagle3_aux_layer_ids": head_aux_layer_ids(pair),
    }


def config_differences(measured: dict[str, Any], expected: dict[str, Any]) -> list[dict[str, Any]]:
    """Field by field, where a measurement's recorded serving config differs from what the
    deployment serves. A field either side does not know (None) is not compared."""
    out = []
    for name in CHECKED:
        want, got = expected.get(name), measured.get(name)
        if want is None or got is None:
            continue
        if want != got:
            out.append({"field": name, "expected": want, "reported": got})
    return out


def serving_config_gate(pair: Pair, m: Measurement) -> GateResult:
    """``serving_config``: the measurement ran under the configuration the deployment
    serves (method, k, dtype, acceptance, chat template, EAGLE-3 layers)."""
    measured = (m.extra or {}).get("serving_config")
    required = "as served: " + ", ".join(CHECKED)
    if not isinstance(measured, dict):
        return GateResult(
            name="serving_config",
            required=required,
            measured="not recorded",
            passed=True,
            detail=f"measurement {m.id} records no serving configuration: nothing to compare",
        )
    diffs = config_differences(measured, expected_config(pair))
    return GateResult(
        name="serving_config",
        required=required,
        measured="; ".join(
            f"{d['field']}: served {d['expected']}, measured {d['reported']}" for d in diffs
        )
        or "same",
        passed=not diffs,
        detail=f"measurement {m.id} ran on {measured.get('engine')} "
        f"{measured.get('engine_version')}",
    )


# --- the measurement a deployment's live pair was validated with ------------------------


def validated_measurement(session: Session, dep: Deployment, pair: Pair) -> Measurement | None:
    """The measurement of the pair's newest passing validation under the deployment's
    policy, else the one behind the validation that made it live."""
    val = session.scalar(
        select(Validation)
        .where(
            Validation.pair_id == pair.id,
            Validation.policy_name == dep.policy_name,
            Validation.passed.is_(True),
            Validation.measurement_id.is_not(None),
        )
        .order_by(Validation.id.desc())
        .limit(1)
    )
    if val is None:
        ev = session.scalar(
            select(DeploymentEvent)
            .where(DeploymentEvent.deployment_id == dep.id)
            .order_by(DeploymentEvent.seq.desc())
            .limit(1)
        )
        if ev is not None and ev.to_pair_id == pair.id and ev.validation_id:
            val = session.get(Validation, ev.validation_id)
    if val is None or val.measurement_id is None:
        return None
    return session.get(Measurement, val.measurement_id)


def pair_validated_measurement(session: Session, pair: Pair) -> Measurement | None:
    """The measurement of the pair's newest passing validation under any policy."""
    val = session.scalar(
        select(Validation)
        .where(
            Validation.pair_id == pair.id,
            Validation.passed.is_(True),
            Validation.measurement_id.is_not(None),
        )
        .order_by(Validation.id.desc())
        .limit(1)
    )
    return session.get(Measurement, val.measurement_id) if val and val.measurement_id else None


def measured_aux_layer_ids(
    pair: Pair, m: Measurement | None, head_config: dict[str, Any]
) -> list[int] | None:
    """The auxiliary layers an export must carry for an EAGLE-3 pair: those its validated
    measurement ran with. ``head_config`` is the head's config.json as the export reads it
    (verified, else what registration recorded). Refused (naming the field) when it
    declares other layers than were measured."""
    if not get_method(pair.method).fuses_target_layers or pair.drafter is None:
        return None
    declared = declared_aux_layer_ids(head_config)
    recorded = ((m.extra or {}).get("serving_config") or {}) if m is not None else {}
    measured = recorded.get("eagle3_aux_layer_ids")
    if m is None or not isinstance(measured, list):
        return declared  # nothing measured to hold it to: the head's own declaration
    measured = [int(i) for i in measured]
    if declared is not None and declared != measured:
        raise InvalidInput(
            f"eagle3_aux_layer_ids: the head {pair.drafter.lineage}@v{pair.drafter.version} "
            f"declares target layers {declared}, its validated measurement {m.id} ran with "
            f"{measured}: served so it would not be the pair that was validated (vLLM #50170)",
            field="eagle3_aux_layer_ids",
        )
    return measured


# --- what a scraped engine reports ------------------------------------------------------


def _source(art: Artifact) -> str | None:
    """What vLLM reports as ``root`` for a part exported by ``pairreg export vllm``: its Hub
    repo, or its local directory."""
    if art.source_kind == "local" and art.local_path:
        return str(art.local_path).rstrip("/")
    return art.hub_repo


def expected_engine(
    session: Session, dep: Deployment, pair: Pair
) -> tuple[dict[str, Any], Measurement | None]:
    """What an engine serving the live pair as exported reports, and the measurement whose
    engine version it is held to."""
    m = validated_measurement(session, dep, pair)
    measured = ((m.extra or {}).get("serving_config") or {}) if m is not None else {}
    spec = get_method(pair.method)
    expected: dict[str, Any] = {
        "served_model": dep.name,
        "root": _source(pair.target),
        "parent": None,
        "speculative_method": spec.vllm_method,
        "num_speculative_tokens": pair.k,
        "draft_model": _source(pair.drafter) if pair.drafter is not None else None,
        "engine": measured.get("engine"),
        "engine_version": measured.get("engine_version"),
    }
    return expected, m


def reported_engine(
    *,
    served_model: str | None,
    root: str | None,
    parent: str | None,
    max_model_len: int | None,
    engine_version: str | None,
) -> dict[str, Any]:
    """What the engine said about itself, in the fields :func:`expected_engine` names."""
    out: dict[str, Any] = {
        "served_model": served_model,
        "root": root.rstrip("/") if root else root,
        "parent": parent,
        "max_model_len": max_model_len,
        "engine": "vllm" if engine_version else None,
        "engine_version": engine_version,
    }
    return out


def engine_differences(
    expected: dict[str, Any], reported: dict[str, Any], *, reported_fields: set[str]
) -> list[dict[str, Any]]:
    """The fields where the engine reports something other than the live pair as exported.
    Only what the engine reported is compared (``reported_fields``); an engine version is
    compared only with a validated measurement taken on the same engine."""
    out = []
    for name in ("served_model", "root", "parent", "speculative_method",
                 "num_speculative_tokens", "draft_model"):  # fmt: skip
        if name not in reported_fields:
            continue
        want, got = expected.get(name), reported.get(name)
        if want != got:
            out.append({"field": name, "expected": want, "reported": got})
    if (
        "engine_version" in reported_fields
        and expected.get("engine_version")
        and expected.get("engine") == reported.get("engine")
        and expected["engine_version"] != reported.get("engine_version")
    ):
        out.append({
            "field": "engine_version",
            "expected": expected["engine_version"],
            "reported": reported.get("engine_version"),
        })  # fmt: skip
    return out


def _remeasure(
    session: Session, dep: Deployment, pair: Pair, version: str, actor: str
) -> int | None:
    """Queue the live pair's measurement under the deployment's policy (the job a
    validation queues, with its validation to follow), once per engine version."""
    from registry.services import jobs as jobs_service
    from registry.services.policies import load_policy
    from registry.services.validation import measure_job_args, measure_key, policy_settings

    try:  # a pair the policy cannot measure now is flagged, not a failed scrape
        pol = load_policy(session, dep.policy_name, actor=actor)
        settings = policy_settings(session, pair, pol)
    except PairregError:
        return None
    args = measure_job_args(
        pair, pol, settings, runner_version=None, suite_digest=None,
        validate={"policy": pol.name, "deployment": dep.name},
    )  # fmt: skip
    key = {**measure_key(pair, args), "purpose": "engine_version", "engine_version": version}
    job = jobs_service.enqueue_remeasure(
        session,
        args=args,
        key_material=key,
        actor=actor,
        action="serving.remeasure_queued",
        pair_id=pair.id,
        payload={
            "pair_digest": pair.pair_digest,
            "deployment": dep.name,
            "engine_version": version,
        },
    )
    return int(job.id)


def check_engine(
    session: Session,
    dep: Deployment,
    pair: Pair,
    reported: dict[str, Any],
    *,
    reported_fields: set[str],
    source: str,
    actor: str,
) -> ServingCheck:
    """Compare what the engine reports with the live pair; open one ``serving`` flag on a
    difference, and queue a re-measurement when only the engine version moved on."""
    expected, m = expected_engine(session, dep, pair)
    diffs = engine_differences(expected, reported, reported_fields=reported_fields)
    check = ServingCheck(
        reported={k: v for k, v in reported.items() if k in reported_fields},
        expected=expected,
        differences=[ServingDifference(**d) for d in diffs],
        flagged=False,
    )
    if not diffs:
        return check
    if any(d["field"] == "engine_version" for d in diffs):
        check.remeasure_job_id = _remeasure(
            session, dep, pair, str(reported["engine_version"]), actor
        )
    flag = session.scalar(
        select(DriftFlag).where(
            DriftFlag.kind == "serving", DriftFlag.pair_id == pair.id, DriftFlag.state == "open"
        )
    )
    if flag is None:
        summary = f"{dep.name} is served other than its live pair {pair.pair_digest[:12]}: " + (
            "; ".join(
                f"{d['field']}: expected {d['expected']}, reported {d['reported']}" for d in diffs
            )  # fmt: skip
        )
        effects = {
            "deployment": dep.name,
            "source": source,
            "differences": diffs,
            "expected": expected,
            "reported": check.reported,
            "validated_measurement_id": m.id if m is not None else None,
            "remeasure_job_id": check.remeasure_job_id,
        }
        only_version = all(d["field"] == "engine_version" for d in diffs)
        flag = open_flag(
            session,
            DriftFlag(
                kind="serving",
                pair_id=pair.id,
                policy_name=dep.policy_name,
                effects=effects,
                severity="medium" if only_version else "high",
                summary=summary,
            ),
            actor=actor,
            payload={"pair_digest": pair.pair_digest, "deployment": dep.name, "summary": summary},
        )
    check.flagged, check.flag_id = True, flag.id
    return check


def card_fields(models: dict[str, Any] | None, deployment: str) -> dict[str, Any]:
    """The ingest parameters from an engine's ``/v1/models`` payload: the card served under
    the deployment's name, else the only card (an engine serving several under other names
    reports the first, whose name then differs)."""
    cards = [c for c in (models or {}).get("data") or [] if isinstance(c, dict)]
    card = next((c for c in cards if c.get("id") == deployment), cards[0] if cards else None)
    if card is None:
        return {}
    mml = card.get("max_model_len")
    return {
        "served_model": str(card.get("id")) if card.get("id") is not None else None,
        "served_root": str(card["root"]) if card.get("root") is not None else None,
        "served_parent": str(card["parent"]) if card.get("parent") is not None else None,
        "max_model_len": int(mml) if isinstance(mml, int) else None,
    }
