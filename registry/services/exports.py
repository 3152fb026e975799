"""Launch arguments for vLLM and SGLang that serve exactly a deployment's live pair.

A part registered from the Hub at a pinned 40-hex commit is exported as repo + revision:
the engine downloads exactly those bytes (from ``HF_ENDPOINT`` when set). A part registered
from a local directory is exported as that directory, after its files have been checked
against the registered manifest here (the same materialisation step a measurement goes
through), so the engine is pointed only at verified bytes; the path is the registry's
machine's, so such an export is served where the files are. A Hub part without a pinned
commit (a branch name) is refused: the engine could load other bytes than the pair digest
covers. Lossy acceptance rules are refused too: neither engine's launch flags reproduce
them, so the served pair would not be the registered one.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field
from sqlalchemy.orm import Session

from registry.artifacts import speculators
from registry.artifacts.manifest import hash_file
from registry.artifacts.materialize import IntegrityError, locate, materialise
from registry.artifacts.serving_config import declared_aux_layer_ids
from registry.errors import InvalidInput, PairregError
from registry.methods import get_method
from registry.records.lifecycle import KSchedule
from registry.records.requests import ExportResult, SpeculatorsExport
from registry.refs import resolve_deployment, resolve_pair
from registry.services import serving as serving_svc
from registry.services.artifacts import to_record as artifact_record
from registry.tables import Artifact, Deployment, Pair

ENGINES = ("vllm", "sglang")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")

# What each engine calls a method, and what it takes of the method's config, is the
# method's own (``vllm_method``, ``vllm_options``, ``sglang_algorithm``: registry/methods/).


def _pinned(art: Artifact, role: str, state_dir: str | None) -> tuple[str, str | None]:
    """``(repo, commit)`` for a pinned Hub part; ``(directory, None)`` for a local part
    whose files match its manifest now; anything else is refused."""
    if art.source_kind == "local" and art.local_path:
        return _verified_local(art, role, state_dir), None
    if art.source_kind != "hf" or not art.hub_repo or not _COMMIT.match(art.hub_commit or ""):
        raise InvalidInput(
            f"{role} {art.lineage}@v{art.version} has no pinned Hub source "
            f"(source {art.source}): engines could load different bytes; register it from "
            "hf://org/repo@<commit> or a local directory",
            field=role,
        )
    return art.hub_repo, str(art.hub_commit)


def _verified_local(art: Artifact, role: str, state_dir: str | None) -> str:
    """The local part's directory, re-checked against its manifest (with the stat cache in
    ``state_dir``, the serving process's own, as a worker's; None: every file re-hashed);
    files that differ refuse the export, naming them."""
    try:
        done = materialise(
            artifact_record(art, with_manifest=True),
            state_dir=Path(state_dir) if state_dir else None,
        )
    except IntegrityError as exc:
        raise InvalidInput(str(exc), field=role) from exc
    except PairregError as exc:
        raise InvalidInput(f"{role}: {exc}", field=role) from exc
    return str(done.path)


def _revision_args(flag: str, commit: str | None) -> list[str]:
    return [flag, commit] if commit else []


def _live_pair(session: Session, deployment: str) -> Pair:
    dep = resolve_deployment(session, deployment)
    if dep.current_pair_id is None:
        raise InvalidInput(f"deployment {deployment} has no live pair", field="deployment")
    pair = session.get(Pair, dep.current_pair_id)
    assert pair is not None
    return pair


def vllm_args(
    pair: Pair,
    deployment: str,
    schedule: KSchedule | None = None,
    state_dir: str | None = None,
) -> tuple[list[str], dict[str, Any]]:
    repo, commit = _pinned(pair.target, "target", state_dir)
    cfg = pair.config
    m = get_method(pair.method)
    if m.vllm_method is None:
        raise InvalidInput(f"vLLM has no speculative method for {pair.method}", field="engine")
    spec: dict[str, Any] = {"method": m.vllm_method, "num_speculative_tokens": pair.k}
    if pair.drafter is not None:
        drepo, dcommit = _pinned(pair.drafter, "drafter", state_dir)
        spec["model"] = drepo
        if dcommit:
            spec["revision"] = dcommit
    spec.update(m.vllm_options(cfg))
    tree = cfg.get("tree")
    if tree:
        if not m.vllm_static_tree or tree.get("kind") != "static":
            what = "dynamic (EAGLE-2)" if tree.get("kind") == "dynamic" else m.title
            what += " trees"
            raise InvalidInput(
                f"vLLM has no {what}: pair {pair.pair_digest[:12]} would be served as a chain, "
                "not as registered" + ("; export it for sglang" if m.sglang_algorithm else ""),
                field="engine",
            )
        # vLLM's tree attention: node paths as a Python literal; one draft token per node
        choices = [tuple(c) for c in tree["choices"]]
        spec["speculative_token_tree"] = str(choices)
        spec["num_speculative_tokens"] = len(choices)
    if schedule is not None:
        spec["num_speculative_tokens_per_batch_size"] = schedule.vllm[
            "num_speculative_tokens_per_batch_size"
        ]
    args = [
        "--model", repo,
        *_revision_args("--revision", commit),
        *_revision_args("--tokenizer-revision", commit),
        "--dtype", str(cfg.get("dtype", "auto")),
        "--served-model-name", deployment,
        "--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":")),
    ]  # fmt: skip
    return args, spec


def sglang_args(pair: Pair, deployment: str, state_dir: str | None = None) -> list[str]:
    algorithm = get_method(pair.method).sglang_algorithm
    if algorithm is None:
        raise InvalidInput(
            f"SGLang has no speculative algorithm for method {pair.method}", field="engine"
        )
    repo, commit = _pinned(pair.target, "target", state_dir)
    top_k, draft_tokens = 1, pair.k + 1  # a chain: one candidate per step, plus the root
    tree = pair.config.get("tree")
    if tree:
        if tree.get("kind") != "dynamic":
            raise InvalidInput(
                "SGLang grows EAGLE trees dynamically and takes no static tree choices: "
                f"pair {pair.pair_digest[:12]} would not be served as registered; export it "
                "for vllm",
                field="engine",
            )
        # SGLang counts the root (the verified token) among the draft tokens
        top_k, draft_tokens = tree["top_k"], tree["total_tokens"] + 1
    args = [
        "--model-path", repo,
        *_revision_args("--revision", commit),
        "--dtype", str(pair.config.get("dtype", "auto")),
        "--served-model-name", deployment,
        "--speculative-algorithm", algorithm,
        "--speculative-num-steps", str(pair.k),
        "--speculative-eagle-topk", str(top_k),
        "--speculative-num-draft-tokens", str(draft_tokens),
    ]  # fmt: skip
    if pair.drafter is not None:
        drepo, dcommit = _pinned(pair.drafter, "drafter", state_dir)
        args += [
            "--speculative-draft-model-path", drepo,
            *_revision_args("--speculative-draft-model-revision", dcommit),
        ]  # fmt: skip
    return args


def export_serving(
    session: Session,
    *,
    deployment: str,
    engine: Literal["vllm", "sglang"],
    hardware: Annotated[
        str | None,
        Field(
            max_length=100,
            description="A hardware profile: add the draft length per batch size that "
            "maximises predicted throughput there (vLLM's "
            "num_speculative_tokens_per_batch_size; never above the pair's k).",
        ),
    ] = None,
    context: Annotated[
        int, Field(ge=1, le=10_000_000, description="Tokens per sequence, for the schedule.")
    ] = 4096,
    max_batch: Annotated[
        int | None, Field(ge=1, le=4096, description="Largest batch size to schedule.")
    ] = None,
    state_dir: str | None = None,
    home_dir: str | None = None,
) -> ExportResult:
    """The engine's launch arguments for the pair live on ``deployment`` now.

    ``state_dir`` (the serving process's stat cache) and ``home_dir`` (its hardware
    profiles) come from the operation's context, never from the caller."""
    if engine not in ENGINES:
        raise InvalidInput(f"engine must be one of {', '.join(ENGINES)}", field="engine")
    pair = _live_pair(session, deployment)
    if pair.lossy:
        raise InvalidInput(
            f"pair {pair.pair_digest[:12]} uses the lossy acceptance rule "
            f"{pair.config.get('acceptance')}, which {engine}'s launch flags cannot express",
            field="deployment",
        )
    schedule = None
    if hardware is not None:
        from registry.economics.hardware import get_profile
        from registry.services.economics import k_schedule_for

        # k_max is the pair's own k: the schedule only shortens or switches off what the
        # pair digest covers, so num_speculative_tokens stays the registered k.
        schedule = k_schedule_for(
            session, pair, profile=get_profile(hardware, home_dir), context=context,
            max_batch=max_batch, k_max=int(pair.k),
        )  # fmt: skip
    dep = resolve_deployment(session, deployment)
    served = serving_config(session, dep, pair)
    if engine == "vllm":
        args, spec = vllm_args(pair, deployment, schedule, state_dir)
        command = shlex.join(["python", "-m", "vllm.entrypoints.openai.api_server", *args])
    else:
        args, spec = sglang_args(pair, deployment, state_dir), None
        if schedule is not None:
            schedule.notes.append(
                "SGLang has no per-batch-size draft length: launch it with the pair's k, or "
                "route batches above the last k>0 range to a deployment without speculation"
            )
        command = shlex.join(["python", "-m", "sglang.launch_server", *args])
    return ExportResult(
        engine=engine,
        deployment=deployment,
        pair_digest=pair.pair_digest,
        args=args,
        command=command,
        speculative_config=spec,
        serving_config=served,
        k_schedule=schedule,
    )


def serving_config(session: Session, dep: Deployment, pair: Pair) -> dict[str, Any]:
    """What the deployment checks the served pair against (registry/services/serving.py):
    the pair's serving configuration, with an EAGLE-3 head's auxiliary layers as its
    validated measurement ran them. vLLM reads the layers from the head's config.json and
    reports them nowhere, so a head whose config declares other layers, or none (the engine
    would choose), is refused here: serve it from ``pairreg export speculators``, which
    writes the measured layers into its config.json."""
    m = serving_svc.validated_measurement(session, dep, pair)
    out = serving_svc.expected_config(pair)
    out["eagle3_aux_layer_ids"] = None
    if pair.drafter is not None and get_method(pair.method).fuses_target_layers:
        config = _head_config(pair.drafter)
        measured = serving_svc.measured_aux_layer_ids(pair, m, config)
        if measured is not None and declared_aux_layer_ids(config) is None:
            raise InvalidInput(
                f"eagle3_aux_layer_ids: the head {pair.drafter.lineage}@v"
                f"{pair.drafter.version} declares no target layers (the engine would choose "
                f"its own); its validated measurement {m.id if m else '?'} ran with {measured}: "
                f"serve the directory `pairreg export speculators {pair.pair_digest[:12]}` "
                "writes, which declares them",
                field="eagle3_aux_layer_ids",
            )
        out["eagle3_aux_layer_ids"] = measured
    measured_cfg = ((m.extra or {}).get("serving_config") or {}) if m is not None else {}
    out["validated_measurement_id"] = m.id if m is not None else None
    out["measured_engine"] = measured_cfg.get("engine")
    out["measured_engine_version"] = measured_cfg.get("engine_version")
    return out


def _head_config(art: Artifact) -> dict[str, Any]:
    """The head's config.json (verified), else what registration recorded of it."""
    try:
        return _verified_config(art)
    except InvalidInput:
        spec = (art.facts or {}).get("speculators") or {}
        ids = spec.get("aux_layer_ids")
        return {"eagle_aux_hidden_state_layer_ids": ids} if ids else {}


# --- speculators ------------------------------------------------------------------------


def export_speculators(
    session: Session,
    *,
    pair: Annotated[str, Field(min_length=1, description="Pair reference (digest or id).")],
) -> SpeculatorsExport:
    """The pair's drafter as a speculators ``config.json`` whose verifier is pinned.

    The verifier keeps its speculators fields (``name_or_path``: the target's Hub repo, or
    its lineage when it has none; ``architectures``) and gains, under the top-level
    ``pairreg`` key that vLLM ignores, the target's 40-hex Hub commit, manifest digest and
    tokenizer digest, the pair digest and the pair's speculation config; the proposal
    methods are set from that config. The drafter's config.json is read from its local
    copy and checked against its manifest first. ``registry.artifacts.speculators.write_export``
    writes the result (config.json plus the drafter's other files) to a directory.
    """
    p = resolve_pair(session, pair)
    if p.drafter is None:
        raise InvalidInput(
            f"pair {p.pair_digest[:12]} ({p.method}) has no drafter to export", field="pair"
        )
    target = p.target
    if target.hub_commit and not _COMMIT.match(target.hub_commit):
        raise InvalidInput(
            f"target {target.lineage}@v{target.version} is pinned to {target.hub_commit!r}, "
            "not a 40-hex commit: the verifier would not be pinned",
            field="pair",
        )
    config = _verified_config(p.drafter)
    measured = serving_svc.pair_validated_measurement(session, p)
    aux = serving_svc.measured_aux_layer_ids(p, measured, config)
    pinned = speculators.pinned_config(
        config,
        verifier_name=target.hub_repo or target.lineage,
        verifier_architectures=list((target.facts or {}).get("architectures") or []),
        verifier_revision=target.hub_commit,
        verifier_manifest_digest=target.manifest_digest,
        verifier_tokenizer_digest=target.tokenizer_digest,
        pair_digest=p.pair_digest,
        method=p.method,
        k=p.k,
        tree=p.config.get("tree"),
    )
    if aux is not None:
        # vLLM reads the layers from here and reports them nowhere: the ones measured
        pinned["eagle_aux_hidden_state_layer_ids"] = aux
        pinned[speculators.PAIRREG_KEY]["eagle3_aux_layer_ids"] = {
            "ids": aux,
            "measurement_id": measured.id if measured is not None else None,
        }
    return SpeculatorsExport(
        pair_digest=p.pair_digest,
        drafter_ref=f"{p.drafter.lineage}@v{p.drafter.version}",
        drafter_manifest_digest=p.drafter.manifest_digest,
        target_ref=f"{target.lineage}@v{target.version}",
        config=pinned,
        files=sorted(e["path"] for e in p.drafter.manifest if e["path"] != "config.json"),
    )


def _verified_config(art: Artifact) -> dict[str, Any]:
    """The drafter's config.json, from its local copy, only if it has the registered bytes."""
    entry = next((e for e in art.manifest if e["path"] == "config.json"), None)
    if entry is None:
        raise InvalidInput(
            f"drafter {art.lineage}@v{art.version} has no config.json to export", field="pair"
        )
    try:
        directory = locate(artifact_record(art))
    except PairregError as exc:
        raise InvalidInput(str(exc), field="pair") from exc
    path = directory / "config.json"
    if not path.is_file() or hash_file(path).sha256 != entry["sha256"]:
        raise InvalidInput(
            f"{path} is missing or differs from drafter {art.lineage}@v{art.version}'s "
            "registered manifest",
            field="pair",
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise InvalidInput(f"{path} does not hold a JSON object", field="pair")
    return data
