"""Registering pairs: normalised config, compatibility checks, the pair digest.

``pair_digest = SHA-256(canonical_json({"target": target manifest digest, "drafter": drafter
manifest digest or null, "config": normalised config}))``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import lifecycle
from registry.audit import append_event, lock_writes
from registry.canonical import digest_of
from registry.errors import InvalidInput
from registry.methods import (
    ACCEPTANCE_RULES,
    DTYPES,
    METHODS,
    PROMPT_LOOKUP_DEFAULTS,
    TYPICAL_DEFAULTS,
    Method,
    is_lossy,
)
from registry.models import Artifact, Pair
from registry.params import Cursor, Limit, Reason
from registry.records import Page, PairRecord, PairRegisterResult, PairStatus, from_row
from registry.refs import resolve_artifact, resolve_pair
from registry.services.artifacts import to_record as artifact_record
from registry.services.base import operation, page_query

# Keys `--set` accepts, with their defaults; everything in the digest is listed here.
COMMON_DEFAULTS: dict[str, Any] = {
    "acceptance": "strict",
    "dtype": "float32",
    "engine": "pairreg",
    "engine_version": "1",
}
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "prompt_lookup": dict(PROMPT_LOOKUP_DEFAULTS),
    "eagle": {"tree": None},
    "eagle3": {"tree": None},
}


TEXT_KEYS = frozenset({"acceptance", "dtype", "engine", "engine_version"})
"""Keys whose values are text: ``engine_version=1.10`` must not become the number 1.1."""


def parse_set_options(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` strings to a dict; values are JSON when they parse, text otherwise
    (always text for :data:`TEXT_KEYS`)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise InvalidInput(f"--set {item!r}: expected key=value", field="set")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key in out:
            raise InvalidInput(f"--set {key} given twice", field=key)
        if key in TEXT_KEYS:
            out[key] = raw
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out


def normalise_config(method: str, k: int, options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults, check types and sort keys: equal intent gives an equal digest."""
    if method not in METHODS:
        raise InvalidInput(f"method must be one of {', '.join(METHODS)}", field="method")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
        raise InvalidInput("k (num_speculative_tokens) must be an integer from 1 to 64", field="k")
    rule = options.get("acceptance", "strict")
    if rule not in ACCEPTANCE_RULES:
        raise InvalidInput(
            f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}", field="acceptance"
        )
    allowed = dict(COMMON_DEFAULTS)
    allowed.update(METHOD_DEFAULTS.get(method, {}))
    if rule == "typical":
        allowed.update(TYPICAL_DEFAULTS)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InvalidInput(
            f"unknown config key {unknown[0]!r} for method {method} with acceptance {rule}; "
            f"allowed: {', '.join(sorted(allowed))}",
            field=unknown[0],
        )
    config = {**allowed, **options}
    if config["dtype"] not in DTYPES:
        raise InvalidInput(f"dtype must be one of {', '.join(DTYPES)}", field="dtype")
    for key in ("engine", "engine_version"):
        config[key] = str(config[key])
    _check_number(config, "typical_epsilon", 0.0, 1.0)
    _check_number(config, "typical_delta", 0.0, 1.0)
    _check_int(config, "strict_prefix_tokens", 0, 100_000)
    _check_int(config, "prompt_lookup_max", 1, 16)
    _check_int(config, "prompt_lookup_min", 1, 16)
    if method == "prompt_lookup" and config["prompt_lookup_min"] > config["prompt_lookup_max"]:
        raise InvalidInput(
            "prompt_lookup_min must not exceed prompt_lookup_max", field="prompt_lookup_min"
        )
    config["method"] = method
    config["num_speculative_tokens"] = k
    return dict(sorted(config.items()))


def _check_number(config: dict[str, Any], key: str, lo: float, hi: float) -> None:
    if key in config:
        value = config[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
            raise InvalidInput(f"{key} must be a number from {lo} to {hi}", field=key)
        config[key] = float(value)


def _check_int(config: dict[str, Any], key: str, lo: int, hi: int) -> None:
    if key in config:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise InvalidInput(f"{key} must be an integer from {lo} to {hi}", field=key)


def pair_digest(target_digest: str, drafter_digest: str | None, config: dict[str, Any]) -> str:
    return digest_of({"target": target_digest, "drafter": drafter_digest, "config": config})


def _target_names(target: Artifact) -> set[str]:
    """Every name by which a drafter might declare this target."""
    names = {
        target.lineage,
        f"{target.lineage}@v{target.version}",
        target.manifest_digest,
        target.source,
    }
    if target.hub_repo:
        names.add(target.hub_repo)
        names.add(f"{target.hub_repo}@{target.hub_commit}")
    return {n.lower() for n in names if n}


def compatibility_findings(
    target: Artifact, drafter: Artifact | None, method: str
) -> tuple[list[str], list[str]]:
    """(errors, warnings) for this combination; errors always refuse the pair."""
    errors: list[str] = []
    warnings: list[str] = []
    if target.role != "target":
        errors.append(f"target {target.lineage}@v{target.version} has role {target.role}")
    if method == "prompt_lookup":
        if drafter is not None:
            errors.append("prompt_lookup uses no drafter model: omit --draft")
        return errors, warnings
    if drafter is None:
        errors.append(f"method {method} needs a drafter: pass --draft")
        return errors, warnings
    tf, df = target.facts or {}, drafter.facts or {}
    if method == "draft_model":
        if drafter.role != "draft":
            errors.append(f"draft_model needs a draft artifact, got role {drafter.role}")
        if target.vocab_digest and drafter.vocab_digest:
            if target.vocab_digest != drafter.vocab_digest:
                errors.append(
                    "vocabulary mismatch: drafter vocab digest "
                    f"{drafter.vocab_digest[:12]} != target {target.vocab_digest[:12]}"
                )
        else:
            warnings.append("vocabulary could not be compared: a tokenizer is missing")
    else:
        if drafter.role not in ("heads", "draft"):
            errors.append(f"{method} needs heads, got role {drafter.role}")
        th, dh = tf.get("hidden_size"), df.get("hidden_size")
        if th and dh and th != dh:
            errors.append(f"hidden size mismatch: heads read {dh}, target has {th}")
        elif not (th and dh):
            warnings.append("hidden size could not be compared: config.json lacks hidden_size")
        tv, dv = tf.get("vocab_size"), df.get("vocab_size")
        if tv and dv and tv != dv:
            errors.append(f"vocabulary size mismatch: heads emit {dv}, target has {tv}")
    declared = [d.get("value") for d in df.get("declared_targets", []) if d.get("value")]
    trained_against = (drafter.provenance or {}).get("trained_against")
    if trained_against:
        declared.append(trained_against)
    if declared:
        known = _target_names(target)
        if not any(str(d).lower() in known for d in declared):
            warnings.append(
                "drafter declares intended target "
                + ", ".join(sorted({str(d) for d in declared}))
                + f", not {target.lineage}@v{target.version}"
            )
    return errors, warnings


def to_record(pair: Pair) -> PairRecord:
    return from_row(
        PairRecord,
        pair,
        target=artifact_record(pair.target),
        drafter=artifact_record(pair.drafter) if pair.drafter else None,
    )


def create_pair_row(
    session: Session,
    *,
    target: Artifact,
    drafter: Artifact | None,
    config: dict[str, Any],
    strict: bool,
    actor: str,
    extra_payload: dict[str, Any] | None = None,
) -> tuple[Pair, bool]:
    """Check, digest and insert (or find) a pair; shared with candidate-pair creation."""
    method = config["method"]
    errors, warnings = compatibility_findings(target, drafter, method)
    if strict and warnings:
        errors.extend(f"(strict) {w}" for w in warnings)
    if errors:
        raise InvalidInput("; ".join(errors), field="draft" if drafter else "target")
    digest = pair_digest(
        target.manifest_digest, drafter.manifest_digest if drafter else None, config
    )
    lock_writes(session)
    existing = session.scalar(select(Pair).where(Pair.pair_digest == digest))
    if existing is not None:
        return existing, False
    pair = Pair(
        pair_digest=digest,
        target_id=target.id,
        drafter_id=drafter.id if drafter else None,
        method=method,
        k=config["num_speculative_tokens"],
        config=config,
        lossy=is_lossy(config["acceptance"]),
        status="registered",
        warnings=warnings,
        registered_by=actor,
    )
    session.add(pair)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="pair.registered",
        entity_type="pair",
        entity_id=pair.id,
        payload={
            "pair_digest": digest,
            "target_manifest_digest": target.manifest_digest,
            "drafter_manifest_digest": drafter.manifest_digest if drafter else None,
            "config": config,
            "warnings": warnings,
            **(extra_payload or {}),
        },
    )
    return pair, True


@operation
def register_pair(
    session: Session,
    *,
    target: Annotated[str, Field(min_length=1, description="Target artifact reference.")],
    draft: Annotated[str | None, Field(description="Drafter artifact reference.")] = None,
    method: Method,
    k: Annotated[int, Field(ge=1, le=64, description="num_speculative_tokens")],
    options: Annotated[
        dict[str, Any] | None, Field(description="Config keys (see docs/registry.md).")
    ] = None,
    strict: Annotated[bool, Field(description="Compatibility warnings become errors.")] = False,
    actor: str,
) -> PairRegisterResult:
    """Register target + drafter + config; the same digest again returns the existing pair."""
    config = normalise_config(method, k, options or {})
    target_art = resolve_artifact(session, target, field="target")
    drafter_art = resolve_artifact(session, draft, field="draft") if draft else None
    pair, created = create_pair_row(
        session, target=target_art, drafter=drafter_art, config=config, strict=strict, actor=actor
    )
    return PairRegisterResult(pair=to_record(pair), created=created)


@operation
def get_pair(session: Session, *, ref: str) -> PairRecord:
    return to_record(resolve_pair(session, ref))


@operation
def list_pairs(
    session: Session,
    *,
    target: str | None = None,
    status: PairStatus | None = None,
    method: Method | None = None,
    cursor: Cursor = None,
    limit: Limit = 100,
) -> Page[PairRecord]:
    stmt = select(Pair)
    if target:
        stmt = stmt.where(Pair.target_id == resolve_artifact(session, target, field="target").id)
    if status:
        stmt = stmt.where(Pair.status == status)
    if method:
        if method not in METHODS:
            raise InvalidInput(f"method must be one of {', '.join(METHODS)}", field="method")
        stmt = stmt.where(Pair.method == method)
    rows, next_cursor = page_query(session, stmt, Pair.id, cursor, limit)
    return Page[PairRecord](items=[to_record(p) for p in rows], next_cursor=next_cursor)


def _withdraw(session: Session, ref: str, event: str, reason: str, actor: str) -> PairRecord:
    reason = reason.strip()
    if not reason:
        raise InvalidInput("a reason is required", field="reason")
    lock_writes(session)
    pair = resolve_pair(session, ref)
    lifecycle.apply(session, pair, event, actor=actor, reason=reason)
    return to_record(pair)


@operation
def deprecate_pair(session: Session, *, ref: str, reason: Reason, actor: str) -> PairRecord:
    """Withdraw a pair: it stays on record (and in past requests' audits) but can no longer
    be promoted. A live pair must be moved off every deployment first."""
    return _withdraw(session, ref, "deprecated", reason, actor)


@operation
def retire_pair(session: Session, *, ref: str, reason: Reason, actor: str) -> PairRecord:
    """Retire a pair for good (from any status but live)."""
    return _withdraw(session, ref, "retired", reason, actor)
