"""Registering pairs: normalised config, compatibility checks, the pair digest.

``pair_digest = SHA-256(canonical_json({"target": target manifest digest, "drafter": drafter
manifest digest or null, "config": normalised config}))``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.artifacts import tokenizer_compat
from registry.artifacts.manifest import hash_file
from registry.artifacts.tokenizer_digest import TokenizerDigestError, load_vocab
from registry.canonical import digest_of
from registry.errors import InvalidInput
from registry.governance import lifecycle
from registry.methods import (
    ACCEPTANCE_RULES,
    DTYPES,
    SPECULATORS_TYPES,
    TABLE,
    TYPICAL_DEFAULTS,
    Method,
    get_method,
    is_lossy,
    normalise_tree,
)
from registry.methods.base import check_int, check_number, reads_hidden_size
from registry.params import Cursor, Limit, Reason
from registry.records.core import (
    Page,
    PairProposal,
    PairRecord,
    PairRegisterResult,
    PairStatus,
    from_row,
)
from registry.refs import resolve_artifact, resolve_pair
from registry.services.artifacts import to_record as artifact_record
from registry.services.base import page_query
from registry.tables import Artifact, Pair
from registry.trust.audit import append_event, lock_writes

# Keys `--set` accepts, with their defaults; everything in the digest is listed here.
COMMON_DEFAULTS: dict[str, Any] = {
    "acceptance": "strict",
    "dtype": "float32",
    "engine": "pairreg",
    "engine_version": "1",
}
# Each method adds its own keys (its defaults and optional keys: registry/methods/).


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
    m = get_method(method)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
        raise InvalidInput("k (num_speculative_tokens) must be an integer from 1 to 64", field="k")
    rule = options.get("acceptance", "strict")
    if rule not in ACCEPTANCE_RULES:
        raise InvalidInput(
            f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}", field="acceptance"
        )
    allowed = dict(COMMON_DEFAULTS)
    allowed.update(m.defaults)
    optional = m.optional_keys
    allowed.update({key: None for key in optional})
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
    check_number(config, "typical_epsilon", 0.0, 1.0)
    check_number(config, "typical_delta", 0.0, 1.0)
    check_int(config, "strict_prefix_tokens", 0, 100_000)
    m.check_config(config)
    if "tree" in config:
        config["tree"] = normalise_tree(config["tree"], m, k, rule)
    for key in optional:
        if config.get(key) is None:
            config.pop(key, None)
    config["method"] = method
    config["num_speculative_tokens"] = k
    return dict(sorted(config.items()))


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
    m = get_method(method)
    if target.role != "target":
        errors.append(f"target {target.lineage}@v{target.version} has role {target.role}")
    if m.drafter == "none":
        if drafter is not None:
            errors.append(f"{m.name} uses no drafter model: omit --draft")
        return errors, warnings
    if drafter is None:
        errors.append(f"method {method} needs a drafter: pass --draft")
        return errors, warnings
    tf, df = target.facts or {}, drafter.facts or {}
    if m.drafter == "model":
        if drafter.role not in m.drafter_roles:
            errors.append(f"{m.name} needs a draft artifact, got role {drafter.role}")
        tp, dp = tf.get("tokenizer"), df.get("tokenizer")
        if tp and dp:
            found = tokenizer_compat.compare_profiles(
                tp, dp, tf.get("vocab_size"), df.get("vocab_size"),
                load_maps=lambda: _local_maps(target, drafter),
            )  # fmt: skip
            errors.extend(found.errors)
            warnings.extend(found.warnings)
            warnings.extend(NOTE + n for n in found.notes)
        elif target.vocab_digest and drafter.vocab_digest:
            if target.vocab_digest != drafter.vocab_digest:
                errors.append(
                    "vocabulary mismatch: drafter vocab digest "
                    f"{drafter.vocab_digest[:12]} != target {target.vocab_digest[:12]}"
                )
        else:
            warnings.append("vocabulary could not be compared: a tokenizer is missing")
    else:
        if drafter.role not in m.drafter_roles:
            errors.append(f"{method} needs heads, got role {drafter.role}")
        th, dh = tf.get("hidden_size"), reads_hidden_size(df)
        if not (th and dh):
            warnings.append("hidden size could not be compared: config.json lacks hidden_size")
        errors.extend(head_fit_errors(tf, df, method))
    spec = df.get("speculators") or {}
    if spec:
        errors.extend(_speculators_method_errors(spec, method))
        warnings.extend(_speculators_warnings(spec, target))
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


NOTE = "note: "  # a finding that passes even under --strict (e.g. padded vocabulary)


def _local_maps(*arts: Artifact) -> tuple[dict[str, int], dict[str, int]] | None:
    """The artifacts' token→id maps, read from their registered local directories when
    the vocabulary file there still has its registered hash (to name a differing token);
    ``None`` when either is not at hand."""
    maps = []
    for art in arts:
        root = Path(art.local_path) if art.local_path else None
        entry = next(
            (e for e in art.manifest or [] if e.get("path") in ("tokenizer.json", "vocab.json")),
            None,
        )
        if root is None or entry is None or not (root / entry["path"]).is_file():
            return None
        if hash_file(root / entry["path"]).sha256 != entry.get("sha256"):
            return None
        try:
            loaded = load_vocab(root)
        except TokenizerDigestError:
            return None
        if loaded is None:
            return None
        maps.append(loaded[0])
    return maps[0], maps[1]


def head_fit_errors(tf: dict[str, Any], df: dict[str, Any], method: str) -> list[str]:
    """Structural reasons a head cannot run on a target (the method says what must fit:
    hidden size, vocabulary, the target layers an EAGLE-3 head reads). A target change that
    trips one of these is an integrity finding for the head's pairs, not a measurement to
    queue."""
    return get_method(method).head_fit_errors(tf, df)


def _speculators_method_errors(spec: dict[str, Any], method: str) -> list[str]:
    """A speculators draft of one algorithm registered under another method."""
    kind = spec.get("model_type") or spec.get("algorithm")
    proposed = (spec.get("proposal") or {}).get("method")
    owner = TABLE.get(SPECULATORS_TYPES.get(str(kind), "")) if kind else None
    if owner is not None and owner.speculators_exclusive and proposed and proposed != method:
        return [f"the drafter is a speculators {kind} head; register it with method {proposed}"]
    return []


def _speculators_warnings(spec: dict[str, Any], target: Artifact) -> list[str]:
    out: list[str] = []
    archs = (spec.get("verifier") or {}).get("architectures") or []
    t_archs = (target.facts or {}).get("architectures") or []
    if archs and t_archs and not set(archs) & set(t_archs):
        out.append(f"drafter's verifier architectures {archs} differ from the target's {t_archs}")
    pin = spec.get("pin") or {}
    pinned = (pin.get("verifier") or {}).get("manifest_digest")
    if pinned and pinned != target.manifest_digest:
        out.append(
            f"drafter was exported pinned to target manifest {pinned[:12]}, "
            f"not {target.lineage}@v{target.version} ({target.manifest_digest[:12]})"
        )
    out.extend((spec.get("proposal") or {}).get("warnings") or [])
    return out


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
        errors.extend(f"(strict) {w}" for w in warnings if not w.startswith(NOTE))
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


def propose_pair(
    session: Session,
    *,
    draft: Annotated[str, Field(min_length=1, description="A speculators-format drafter.")],
    target: Annotated[
        str | None, Field(description="Target to check against; default: the one it names.")
    ] = None,
) -> PairProposal:
    """Read a speculators drafter's algorithm, proposal and verifier and propose the pair.

    Without ``target``, the target is the registered artifact whose manifest the drafter's
    pin names (an export of pairreg's), else the newest version of the lineage whose name,
    Hub repo or digest matches the verifier's ``name_or_path`` (ambiguous when several
    lineages match: they are listed as candidates and no target is chosen). The proposal
    is then checked exactly as ``register_pair`` would check it.
    """
    drafter = resolve_artifact(session, draft, field="draft")
    spec = (drafter.facts or {}).get("speculators")
    if not spec:
        raise InvalidInput(
            f"{drafter.lineage}@v{drafter.version} has no speculators_config in config.json",
            field="draft",
        )
    proposal = spec.get("proposal") or {}
    verifier = dict(spec.get("verifier") or {})
    pin = spec.get("pin") or {}
    if pin.get("verifier"):
        verifier["pin"] = pin["verifier"]
    candidates: list[Artifact] = []
    if target:
        target_art: Artifact | None = resolve_artifact(session, target, field="target")
    else:
        target_art, candidates = _verifier_target(session, verifier)
    errors: list[str] = []
    warnings = list(proposal.get("warnings") or [])
    method, k = proposal.get("method"), proposal.get("k")
    options: dict[str, Any] = {"tree": proposal["tree"]} if proposal.get("tree") else {}
    if method not in TABLE:
        errors.append(f"no pairreg method for speculators algorithm {spec.get('algorithm')!r}")
        method = None
    if k is None:
        errors.append("the drafter's default proposal method names no speculative_tokens")
    if target_art is None:
        errors.append(
            "no registered target matches the verifier "
            f"{verifier.get('name_or_path')!r}" + (" unambiguously" if candidates else "")
        )
    if method and k and target_art is not None:
        try:
            normalise_config(method, k, options)
            errs, warns = compatibility_findings(target_art, drafter, method)
            errors += errs
            warnings += warns
        except InvalidInput as exc:
            errors.append(str(exc))
    return PairProposal(
        drafter=artifact_record(drafter),
        target=artifact_record(target_art) if target_art is not None else None,
        candidates=[f"{a.lineage}@v{a.version}" for a in candidates],
        method=method,
        k=k,
        options=options,
        verifier=verifier,
        errors=errors,
        warnings=sorted(set(warnings), key=warnings.index),
        registrable=not errors,
    )


def _verifier_target(
    session: Session, verifier: dict[str, Any]
) -> tuple[Artifact | None, list[Artifact]]:
    """The target a drafter's verifier designates: its pin, else its name (newest version
    of the one matching lineage)."""
    pinned = (verifier.get("pin") or {}).get("manifest_digest")
    if pinned:
        art = session.scalar(
            select(Artifact).where(Artifact.manifest_digest == pinned, Artifact.role == "target")
        )
        if art is not None:
            return art, [art]
    name = str(verifier.get("name_or_path") or "").lower()
    if not name:
        return None, []
    matches = [
        a
        for a in session.scalars(select(Artifact).where(Artifact.role == "target"))
        if name in _target_names(a)
    ]
    lineages = sorted({a.lineage for a in matches})
    if len(lineages) != 1:
        newest = {ln: max((a for a in matches if a.lineage == ln), key=lambda a: a.version)
                  for ln in lineages}  # fmt: skip
        return None, [newest[ln] for ln in lineages]
    best = max(matches, key=lambda a: a.version)
    return best, [best]


def get_pair(session: Session, *, ref: str) -> PairRecord:
    return to_record(resolve_pair(session, ref))


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
        stmt = stmt.where(Pair.method == get_method(method).name)
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


def deprecate_pair(session: Session, *, ref: str, reason: Reason, actor: str) -> PairRecord:
    """Withdraw a pair: it stays on record (and in past requests' audits) but can no longer
    be promoted. A live pair must be moved off every deployment first."""
    return _withdraw(session, ref, "deprecated", reason, actor)


def retire_pair(session: Session, *, ref: str, reason: Reason, actor: str) -> PairRecord:
    """Retire a pair for good (from any status but live)."""
    return _withdraw(session, ref, "retired", reason, actor)
