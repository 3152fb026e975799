"""Launch arguments for vLLM and SGLang that serve exactly a deployment's live pair.

Only a pair whose artifacts come from the Hub at a pinned 40-hex commit can be exported:
the engines download by repo and revision, and a branch name or a local path would let
them load different bytes than the ones the pair digest covers. Lossy acceptance rules are
refused too: neither engine's launch flags reproduce them, so the served pair would not be
the registered one.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Literal

from sqlalchemy.orm import Session

from registry.errors import InvalidInput
from registry.models import Artifact, Pair
from registry.records_requests import ExportResult
from registry.refs import resolve_deployment
from registry.services.base import operation

ENGINES = ("vllm", "sglang")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")

VLLM_METHOD = {
    "draft_model": "draft_model",
    "prompt_lookup": "ngram",
    "medusa": "medusa",
    "eagle": "eagle",
    "eagle3": "eagle3",
    "mtp": "mtp",
}
SGLANG_ALGORITHM = {
    "draft_model": "STANDALONE",
    "prompt_lookup": "NGRAM",
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
}


def _pinned(art: Artifact, role: str) -> tuple[str, str]:
    if art.source_kind != "hf" or not art.hub_repo or not _COMMIT.match(art.hub_commit or ""):
        raise InvalidInput(
            f"{role} {art.lineage}@v{art.version} has no pinned Hub source "
            f"(source {art.source}): engines could load different bytes; register it from "
            "hf://org/repo@<commit>",
            field=role,
        )
    return art.hub_repo, str(art.hub_commit)


def _live_pair(session: Session, deployment: str) -> Pair:
    dep = resolve_deployment(session, deployment)
    if dep.current_pair_id is None:
        raise InvalidInput(f"deployment {deployment} has no live pair", field="deployment")
    pair = session.get(Pair, dep.current_pair_id)
    assert pair is not None
    return pair


def vllm_args(pair: Pair, deployment: str) -> tuple[list[str], dict[str, Any]]:
    repo, commit = _pinned(pair.target, "target")
    cfg = pair.config
    spec: dict[str, Any] = {
        "method": VLLM_METHOD[pair.method],
        "num_speculative_tokens": pair.k,
    }
    if pair.drafter is not None:
        drepo, dcommit = _pinned(pair.drafter, "drafter")
        spec["model"] = drepo
        spec["revision"] = dcommit
    if pair.method == "prompt_lookup":
        spec["prompt_lookup_max"] = cfg.get("prompt_lookup_max")
        spec["prompt_lookup_min"] = cfg.get("prompt_lookup_min")
    args = [
        "--model", repo,
        "--revision", commit,
        "--tokenizer-revision", commit,
        "--dtype", str(cfg.get("dtype", "auto")),
        "--served-model-name", deployment,
        "--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":")),
    ]  # fmt: skip
    return args, spec


def sglang_args(pair: Pair, deployment: str) -> list[str]:
    algorithm = SGLANG_ALGORITHM.get(pair.method)
    if algorithm is None:
        raise InvalidInput(
            f"SGLang has no speculative algorithm for method {pair.method}", field="engine"
        )
    repo, commit = _pinned(pair.target, "target")
    args = [
        "--model-path", repo,
        "--revision", commit,
        "--dtype", str(pair.config.get("dtype", "auto")),
        "--served-model-name", deployment,
        "--speculative-algorithm", algorithm,
        "--speculative-num-steps", str(pair.k),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(pair.k + 1),
    ]  # fmt: skip
    if pair.drafter is not None:
        drepo, dcommit = _pinned(pair.drafter, "drafter")
        args += [
            "--speculative-draft-model-path", drepo,
            "--speculative-draft-model-revision", dcommit,
        ]  # fmt: skip
    return args


@operation
def export_serving(
    session: Session, *, deployment: str, engine: Literal["vllm", "sglang"]
) -> ExportResult:
    """The engine's launch arguments for the pair live on ``deployment`` now."""
    if engine not in ENGINES:
        raise InvalidInput(f"engine must be one of {', '.join(ENGINES)}", field="engine")
    pair = _live_pair(session, deployment)
    if pair.lossy:
        raise InvalidInput(
            f"pair {pair.pair_digest[:12]} uses the lossy acceptance rule "
            f"{pair.config.get('acceptance')}, which {engine}'s launch flags cannot express",
            field="deployment",
        )
    if engine == "vllm":
        args, spec = vllm_args(pair, deployment)
        command = shlex.join(["python", "-m", "vllm.entrypoints.openai.api_server", *args])
    else:
        args, spec = sglang_args(pair, deployment), None
        command = shlex.join(["python", "-m", "sglang.launch_server", *args])
    return ExportResult(
        engine=engine,
        deployment=deployment,
        pair_digest=pair.pair_digest,
        args=args,
        command=command,
        speculative_config=spec,
    )
