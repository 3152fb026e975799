"""Pair economics: the model of :mod:`registry.economics.model` applied to a registered pair,
its latest measurement and a hardware profile; and the hardware profiles themselves.

Facts come from the artifacts' registered files (stored at registration; for artifacts
registered before that, read from the local copy after checking ``config.json`` against the
manifest). τ and the measured step costs come from the pair's latest measurement.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.artifacts.manifest import hash_file
from registry.economics import facts as ef
from registry.economics import hardware as hw_mod
from registry.economics import model as em
from registry.economics import schedule as ks
from registry.errors import InvalidInput
from registry.records.economics import (
    EconomicsPoint,
    EconomicsReport,
    HardwareList,
    HardwareRecord,
    MeasuredEconomics,
    PartFacts,
)
from registry.records.lifecycle import AcceptanceLengthRecord, KRange, KSchedule
from registry.refs import resolve_pair
from registry.tables import Artifact, Measurement, Pair

DEFAULT_BATCHES = (1, 8, 32, 128)
DEFAULT_CONTEXT = 4096
LOCAL_PROFILE = "local-cpu"
FALLBACK_PROFILE = "h100-sxm"
_FLOAT_TYPES = {"F64", "F32", "F16", "BF16"}


def hardware_record(p: hw_mod.HardwareProfile) -> HardwareRecord:
    return HardwareRecord(**p.to_dict())


def default_profile_name(home: Any = None) -> str:
    """The measured profile of this machine when one was written (in ``home``, the serving
    process's own home from the operation's context), else the H100 SXM."""
    profiles = hw_mod.load_profiles(home)
    return LOCAL_PROFILE if LOCAL_PROFILE in profiles else FALLBACK_PROFILE


def artifact_facts(art: Artifact) -> ef.EconomicFacts:
    """Stored facts, or read from the local copy after checking its config.json."""
    data = (art.facts or {}).get("economics")
    if isinstance(data, dict):
        return ef.EconomicFacts.from_dict(data)
    from registry.artifacts.materialize import locate
    from registry.services.artifacts import to_record

    ref = f"{art.lineage}@v{art.version}"
    directory = locate(to_record(art))
    entry = next((e for e in art.manifest if e["path"] == "config.json"), None)
    if entry is not None and hash_file(directory / "config.json") != entry["sha256"]:
        raise InvalidInput(f"{ref}: config.json differs from the manifest", field="pair")
    try:
        return ef.read_facts(directory, art.manifest)
    except ef.FactsError as exc:
        raise InvalidInput(f"{ref}: {exc}", field="pair") from exc


def _part(
    art: Artifact, role: str, dtype: str, context: int
) -> tuple[em.Part, PartFacts, list[str]]:
    facts = artifact_facts(art)
    w, arch = facts.weights, facts.arch
    per = ef.DTYPE_BYTES[dtype]
    notes: list[str] = []
    if w.source == "safetensors":
        nbytes = sum(
            (w.params_by_dtype[d] * per if d in _FLOAT_TYPES else b)
            for d, b in w.bytes_by_dtype.items()
        )
        params = w.params
    else:  # no headers to read: the files' bytes at the checkpoint's own dtype
        nbytes = w.bytes
        stored = ef.DTYPE_BYTES.get(arch.torch_dtype or "float32", 4)
        params = int(w.bytes / stored)
        notes.append(f"{role}: no safetensors; parameters estimated from file sizes")
    kv = ef.kv_bytes_per_token(arch, per) or 0
    if kv == 0 and role == "target":
        notes.append("target: config lacks layers/heads; KV cache counted as zero")
    part = em.Part(weight_bytes=nbytes, params=params, kv_bytes_per_token=kv, arch=arch)
    rec = PartFacts(
        role=role,
        ref=f"{art.lineage}@v{art.version}",
        params=int(params),
        weight_bytes=int(nbytes),
        kv_bytes_per_token=int(kv),
        num_layers=arch.num_layers,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        flops_per_token=ef.flops_per_token(params, arch, context),
        source=w.source,
    )
    return part, rec, notes


def latest_measurement(session: Session, pair: Pair) -> Measurement | None:
    return session.scalar(
        select(Measurement)
        .where(Measurement.pair_id == pair.id)
        .order_by(Measurement.id.desc())
        .limit(1)
    )


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def measured_economics(m: Measurement) -> MeasuredEconomics | None:
    econ = (m.extra or {}).get("economics")
    if not isinstance(econ, dict):
        return None
    meas, pred = _num(econ.get("speedup_measured")), _num(econ.get("speedup_predicted"))
    by_tokens = ((econ.get("spec") or {}).get("target_by_tokens")) or {}
    return MeasuredEconomics(
        measurement_id=m.id,
        hardware=m.hardware or {},
        speedup_measured=meas,
        speedup_predicted=pred,
        prediction_error=None if not meas or pred is None else pred / meas - 1,
        cost_ratio_c=_num(econ.get("cost_ratio_c")),
        plain_call_s=_num(econ.get("plain_call_s")),
        verify_call_s=_num(econ.get("verify_call_s")),
        draft_step_s=_num(econ.get("draft_step_s")),
        target_s_by_tokens={
            n: float(r["mean_s"]) for n, r in by_tokens.items() if _num(r.get("mean_s"))
        },
    )


def build_report(
    session: Session,
    pair: Pair,
    *,
    profile: hw_mod.HardwareProfile,
    batches: list[int],
    context: int,
    price: float | None,
    memory_fraction: float,
    measurement: Measurement | None = None,
    tau: float | None = None,
) -> EconomicsReport:
    """The economics of ``pair`` on ``profile`` (the one computation behind the operation
    and the policy gates)."""
    cfg = pair.config
    dtype = str(cfg.get("dtype", "float32"))
    m = measurement if measurement is not None else latest_measurement(session, pair)
    if tau is not None:
        tau_used, tau_source = float(tau), "given"
    else:
        mt = _num(((m.overall or {}) if m is not None else {}).get("tau"))
        if mt is None:
            raise InvalidInput(
                f"pair {pair.id} has no measurement with τ; measure it first or give tau",
                field="tau",
            )
        assert m is not None
        tau_used, tau_source = mt, f"measurement {m.id}"
    target, t_rec, notes = _part(pair.target, "target", dtype, context)
    drafter: em.Part | None = None
    d_rec: PartFacts | None = None
    if pair.drafter is not None:
        drafter, d_rec, d_notes = _part(pair.drafter, "drafter", dtype, context)
        notes += d_notes
    drafted = None
    if m is not None and cfg.get("tree"):
        drafted = _num((m.overall or {}).get("draft_tokens_per_step"))
    shape = em.shape_for(pair.method, int(pair.k), tau_used, drafted)
    parts = [target] + ([drafter] if drafter else [])
    b_plain = em.max_batch(profile, [target], context, memory_fraction)
    b_spec = em.max_batch(profile, parts, context, memory_fraction)
    price_used = price if price is not None else profile.price_per_hour
    if price_used is None:
        notes.append("no price per hour: costs left out (give --price)")

    def at(b: int) -> em.Point:
        return em.point(
            target, drafter, shape, profile, dtype,
            batch=b, context=context, price=price_used, max_batch=b_spec,
        )  # fmt: skip

    points = [at(b) for b in batches]
    return EconomicsReport(
        pair_id=pair.id,
        pair_digest=pair.pair_digest,
        method=pair.method,
        k=int(pair.k),
        tree=bool(cfg.get("tree")),
        dtype=dtype,
        tau=tau_used,
        tau_source=tau_source,
        hardware=hardware_record(profile),
        context=context,
        price_per_hour=price_used,
        memory_fraction=memory_fraction,
        target=t_rec,
        drafter=d_rec,
        max_batch_plain=b_plain,
        max_batch_spec=b_spec,
        draft_memory_fraction=em.draft_memory_fraction(
            profile, drafter, b_spec, context, memory_fraction
        ),
        break_even_batch=em.break_even_batch(lambda b: at(b).speedup, b_spec),
        points=[EconomicsPoint(**vars(p)) for p in points],
        measured=measured_economics(m) if m is not None else None,
        notes=notes,
    )


def _batches(batch: list[int] | None) -> list[int]:
    out = list(batch or DEFAULT_BATCHES)
    if not out or len(out) > 64:
        raise InvalidInput("batch must list 1 to 64 sizes", field="batch")
    for b in out:
        if b < 1 or b > em.MAX_BATCH_SEARCH:
            raise InvalidInput(f"batch sizes must be 1..{em.MAX_BATCH_SEARCH}", field="batch")
    return sorted(set(out))


def pair_economics(
    session: Session,
    *,
    pair: Annotated[str, Field(min_length=1, description="Pair id or digest prefix.")],
    hardware: Annotated[
        str | None,
        Field(max_length=100, description="Profile name (default: local-cpu if measured)."),
    ] = None,
    batch: Annotated[
        list[int] | None, Field(description="Batch sizes (default 1, 8, 32, 128).")
    ] = None,
    context: Annotated[int, Field(ge=1, le=10_000_000, description="Tokens per sequence.")] = (
        DEFAULT_CONTEXT
    ),
    price: Annotated[
        float | None, Field(gt=0, le=1e6, description="Price per hour (overrides the profile).")
    ] = None,
    tau: Annotated[
        float | None, Field(ge=1, le=1000, description="τ to use instead of the measured one.")
    ] = None,
    memory_fraction: Annotated[
        float, Field(gt=0, le=1, description="Share of device memory a server plans with.")
    ] = em.DEFAULT_MEMORY_FRACTION,
    compare: Annotated[
        str | None, Field(description="Another pair to set beside this one.")
    ] = None,
    home_dir: str | None = None,
) -> EconomicsReport:
    """Predicted speed-up, memory limits, break-even batch and cost per 1M tokens of a pair
    on a hardware profile, with what its latest measurement timed at batch 1.

    Profiles are the shipped ones plus those in ``home_dir`` (the serving process's home,
    from the operation's context; None: shipped only)."""
    p = resolve_pair(session, pair)
    profile = hw_mod.get_profile(hardware or default_profile_name(home_dir), home_dir)
    sizes = _batches(batch)
    args: dict[str, Any] = {
        "profile": profile,
        "batches": sizes,
        "context": context,
        "price": price,
        "memory_fraction": memory_fraction,
    }
    report = build_report(session, p, tau=tau, **args)
    if compare is not None:
        other = resolve_pair(session, compare)
        try:
            report.compare = build_report(session, other, **args)
        except InvalidInput as exc:
            raise InvalidInput(f"compare: {exc}", field="compare") from exc
        if other.target_id != p.target_id:
            report.notes.append(f"pair {other.id} has another target: not like for like")
    return report


def list_hardware(session: Session, *, home_dir: str | None = None) -> HardwareList:
    """Every hardware profile: shipped (vendor datasheets), measured and the user's own
    (in ``home_dir``, from the operation's context)."""
    del session
    profiles = hw_mod.load_profiles(home_dir)
    return HardwareList(items=[hardware_record(p) for _, p in sorted(profiles.items())])


# --- speculate only where it pays (docs/lifecycle.md) ------------------------------------


def k_schedule_for(
    session: Session,
    p: Pair,
    *,
    profile: hw_mod.HardwareProfile,
    context: int,
    max_batch: int | None,
    k_max: int,
    category: str | None = None,
    memory_fraction: float = em.DEFAULT_MEMORY_FRACTION,
) -> KSchedule:
    """The throughput-maximising k per batch size for a pair on a profile (the one
    computation behind ``k_schedule`` and ``export_serving --hardware``)."""
    if p.config.get("tree"):
        raise InvalidInput(
            f"pair {p.pair_digest[:12]} drafts a tree: its size is not a draft length k",
            field="pair",
        )
    if int(p.k) > k_max:
        raise InvalidInput(f"k_max must be at least the pair's k ({p.k})", field="k_max")
    m = latest_measurement(session, p)
    if m is None:
        raise InvalidInput(f"pair {p.pair_digest[:12]} has no measurement", field="pair")
    group = (m.categories or {}).get(category) if category else m.overall
    if not isinstance(group, dict):
        raise InvalidInput(f"measurement {m.id} has no category {category!r}", field="category")
    per_pos = list(group.get("per_position") or [])
    if not per_pos:
        raise InvalidInput(
            f"measurement {m.id} has no per-position acceptance to derive τ per k from",
            field="pair",
        )
    lengths = ks.acceptance_lengths(
        per_pos, list(group.get("per_position_conditional") or []), k_max
    )
    dtype = str(p.config.get("dtype", "float32"))
    target, _, notes = _part(p.target, "target", dtype, context)
    drafter = None
    if p.drafter is not None:
        drafter, _, d_notes = _part(p.drafter, "drafter", dtype, context)
        notes += d_notes
    fits = em.max_batch(
        profile, [target] + ([drafter] if drafter else []), context, memory_fraction
    )
    if fits < 1:
        raise InvalidInput(
            f"the pair does not fit on {profile.name} at context {context}", field="hardware"
        )
    top = min(fits, max_batch or ks.DEFAULT_MAX_BATCH)
    if max_batch and max_batch > fits:
        notes.append(f"batch sizes above {fits} do not fit beside the drafter: schedule ends there")
    cache: dict[tuple[int, int], float] = {}

    def throughput(b: int, k: int) -> float:
        if (b, k) not in cache:
            shape = em.shape_for(p.method, max(k, 1), lengths[k].length if k else 1.0)
            pt = em.point(target, drafter, shape, profile, dtype, batch=b, context=context,
                          price=None)  # fmt: skip
            got = pt.plain_tokens_per_s if k == 0 else pt.spec_tokens_per_s
            cache[(b, k)] = float(got or 0.0)
        return cache[(b, k)]

    if throughput(1, 0) <= 0 or throughput(1, int(p.k)) <= 0:
        raise InvalidInput(
            f"the pair's artifacts give no step cost on {profile.name} (no weights, no "
            "overhead): there is no throughput to compare",
            field="pair",
        )
    choices = [x.k for x in lengths if x.k >= 1]
    ranges = ks.choose(throughput, choices, top)
    fixed = int(p.k)
    gains = [throughput(b, _k_at(ranges, b)) / throughput(b, fixed) for b in range(1, top + 1)]
    plain_gains = [throughput(b, _k_at(ranges, b)) / throughput(b, 0) for b in range(1, top + 1)]
    if any(x.source == "extrapolated" for x in lengths):
        measured = max(x.k for x in lengths if x.source == "measured")
        notes.append(
            f"acceptance beyond k={measured} is extrapolated from the last measured position"
        )
    k_top = max(r.k for r in ranges)
    return KSchedule(
        pair_digest=p.pair_digest,
        method=p.method,
        fixed_k=fixed,
        hardware=profile.name,
        context=context,
        dtype=dtype,
        measurement_id=m.id,
        category=category,
        max_batch=top,
        acceptance=[AcceptanceLengthRecord(**vars(x)) for x in lengths],
        ranges=[
            KRange(
                start_bs=r.start_bs,
                end_bs=r.end_bs,
                k=r.k,
                tokens_per_s=list(r.tokens_per_s),
                plain_tokens_per_s=list(r.plain_tokens_per_s),
                fixed_k_tokens_per_s=[throughput(r.start_bs, fixed), throughput(r.end_bs, fixed)],
                gain_over_fixed_k=[
                    r.tokens_per_s[0] / throughput(r.start_bs, fixed),
                    r.tokens_per_s[1] / throughput(r.end_bs, fixed),
                ],
            )
            for r in ranges
        ],
        mean_gain_over_fixed_k=sum(gains) / len(gains),
        mean_gain_over_plain=sum(plain_gains) / len(plain_gains),
        vllm={
            # vLLM caps every scheduled k at num_speculative_tokens, which must be >= 1
            "num_speculative_tokens": max(k_top, 1),
            "num_speculative_tokens_per_batch_size": ks.vllm_schedule(ranges),
        },
        trtllm={"draft_len_schedule": ks.trtllm_draft_len_schedule(ranges)},
        sglang=None,
        notes=notes,
    )


def _k_at(ranges: list[ks.Range], b: int) -> int:
    return next(r.k for r in ranges if r.start_bs <= b <= r.end_bs)


def k_schedule(
    session: Session,
    *,
    pair: Annotated[str, Field(min_length=1, description="Pair id or digest prefix.")],
    hardware: Annotated[
        str | None, Field(max_length=100, description="Profile name (default as economics).")
    ] = None,
    context: Annotated[int, Field(ge=1, le=10_000_000, description="Tokens per sequence.")] = (
        DEFAULT_CONTEXT
    ),
    max_batch: Annotated[
        int | None, Field(ge=1, le=4096, description="Largest batch size to schedule.")
    ] = None,
    k_max: Annotated[int, Field(ge=1, le=16, description="Longest draft length to consider.")] = (
        ks.K_MAX
    ),
    category: Annotated[
        str | None, Field(description="Use one category's acceptance instead of overall.")
    ] = None,
    home_dir: str | None = None,
) -> KSchedule:
    """The draft length that maximises predicted throughput at each batch size (0 where
    speculation loses), as vLLM's and TensorRT-LLM's batch-size schedules, with the
    prediction and the gain over the pair's fixed k beside each range."""
    p = resolve_pair(session, pair)
    profile = hw_mod.get_profile(hardware or default_profile_name(home_dir), home_dir)
    return k_schedule_for(
        session, p, profile=profile, context=context, max_batch=max_batch, k_max=k_max,
        category=category,
    )  # fmt: skip
