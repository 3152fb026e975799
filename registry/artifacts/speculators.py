"""The speculators checkpoint format (vllm-project/speculators), read and written.

A speculators draft's ``config.json`` carries ``speculators_model_type``,
``speculators_version`` and ``speculators_config: {algorithm, proposal_methods[…],
default_proposal_method, verifier: {name_or_path, architectures}}`` beside the draft's own
``transformer_layer_config``. The verifier is named, never pinned: no revision, no hash.

pairreg adds one top-level key, ``pairreg``, when it exports a pair: the verifier's Hub
commit, manifest digest and tokenizer digest, the pair digest and the pair's speculation
config. vLLM builds its draft config from ``transformer_layer_config`` plus a few named
keys and ignores the rest, and speculators' own config class keeps unknown top-level keys
(``extra="allow"``, whereas its verifier model would drop unknown keys), so the block
survives both and pairreg reads it back.

Proposal types (speculators ``proposals/``): ``greedy`` and ``sampling`` draft a chain of
``speculative_tokens``; ``static_tree`` has ``initial_branching_factor``,
``branching_factor`` and ``depth``; ``dynamic_tree`` (EAGLE-2) has ``expansion_factor``
(top-k), ``depth`` and ``speculative_tokens`` (the nodes verified).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.methods import SPECULATORS_TYPES, TABLE, get_method

PAIRREG_KEY = "pairreg"
PIN_FORMAT = "pairreg-pin-1"
# speculators_model_type / algorithm -> pair method (each method names its types)
METHOD_OF = SPECULATORS_TYPES
MAX_STATIC_NODES = 512


@dataclass
class Proposal:
    """What a speculators config implies for a pair: method, k and tree (pair config
    terms), plus anything pairreg cannot reproduce exactly."""

    method: str | None
    k: int | None
    tree: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    def options(self) -> dict[str, Any]:
        return {"tree": self.tree} if self.tree is not None else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def spec_block(config: dict[str, Any] | None) -> dict[str, Any] | None:
    spec = (config or {}).get("speculators_config")
    return spec if isinstance(spec, dict) else None


def default_proposal(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The proposal method named by ``default_proposal_method`` (else the first), as vLLM
    picks it."""
    methods = [m for m in spec.get("proposal_methods") or [] if isinstance(m, dict)]
    if not methods:
        return None
    name = spec.get("default_proposal_method")
    return next((m for m in methods if m.get("proposal_type") == name), methods[0])


def static_choices(initial: int, branching: int, depth: int) -> list[list[int]]:
    """A speculators ``static_tree`` as explicit candidate-rank paths."""
    out: list[list[int]] = []
    level: list[tuple[int, ...]] = [(r,) for r in range(initial)]
    for d in range(depth):
        out += [list(p) for p in level]
        if len(out) > MAX_STATIC_NODES:
            raise ValueError(f"static tree exceeds {MAX_STATIC_NODES} nodes")
        if d + 1 < depth:
            level = [(*p, r) for p in level for r in range(branching)]
    return out


def branching_of(choices: list[list[int]]) -> tuple[int, int, int] | None:
    """``(initial, branching, depth)`` when ``choices`` is exactly a speculators static
    tree, else None."""
    depth = max(len(c) for c in choices)
    initial = sum(1 for c in choices if len(c) == 1)
    branching = max((c[-1] + 1 for c in choices if len(c) > 1), default=1)
    if depth > 1 and static_choices(initial, branching, depth) == sorted(
        choices, key=lambda c: (len(c), c)
    ):
        return initial, branching, depth
    if depth == 1 and sorted(choices) == [[r] for r in range(initial)]:
        return initial, 1, 1
    return None


def proposal_from_config(config: dict[str, Any]) -> Proposal:
    """Method, k and tree implied by a speculators config.json (dict).

    A ``pairreg`` block (written by :func:`pinned_config`) wins: it holds the exact pair
    config, including static trees the speculators schema cannot express.
    """
    pin = read_pin(config)
    if pin and pin.get("method") and _int(pin.get("num_speculative_tokens")):
        return Proposal(pin["method"], pin["num_speculative_tokens"], pin.get("tree"))
    spec = spec_block(config) or {}
    kind = config.get("speculators_model_type") or spec.get("algorithm")
    method = METHOD_OF.get(str(kind)) if kind else None
    out = Proposal(method, None)
    if kind and method is None:
        out.warnings.append(f"speculators type {kind!r} has no pairreg method")
    prop = default_proposal(spec)
    if prop is None:
        return out
    ptype = prop.get("proposal_type")
    if ptype in ("greedy", "sampling"):
        out.k = _int(prop.get("speculative_tokens"))
        lenience = prop.get("accept_lenience", 1.0)
        if ptype == "sampling" and lenience not in (1, 1.0):
            out.warnings.append(
                f"accept_lenience {lenience} is a lossy rule; pairreg verifies strictly"
            )
    elif ptype == "static_tree":
        depth = _int(prop.get("depth")) or 0
        initial = _int(prop.get("initial_branching_factor")) or 0
        branching = _int(prop.get("branching_factor")) or 0
        if depth >= 1 and initial >= 1 and branching >= 1:
            out.k = depth
            out.tree = {"kind": "static", "choices": static_choices(initial, branching, depth)}
    elif ptype == "dynamic_tree":
        depth = _int(prop.get("depth"))
        top_k = _int(prop.get("expansion_factor"))
        total = _int(prop.get("speculative_tokens"))
        if depth and top_k and total:
            out.k = depth
            out.tree = {"kind": "dynamic", "top_k": top_k, "total_tokens": total}
    else:
        out.warnings.append(f"proposal type {ptype!r} is not one pairreg runs")
    return out


def proposal_methods_for(k: int, tree: dict[str, Any] | None) -> list[dict[str, Any]]:
    """speculators ``proposal_methods`` for a pair config (the first is the default)."""
    greedy = {
        "proposal_type": "greedy",
        "speculative_tokens": k,
        "verifier_accept_k": 1,
        "accept_tolerance": 0.0,
    }
    if not tree:
        return [greedy]
    if tree.get("kind") == "dynamic":
        return [
            {
                "proposal_type": "dynamic_tree",
                "speculative_tokens": tree["total_tokens"],
                "expansion_factor": tree["top_k"],
                "depth": k,
            },
            greedy,
        ]
    shape = branching_of(tree["choices"])
    if shape is None:  # not expressible: the exact tree lives in the pairreg block
        return [greedy]
    initial, branching, depth = shape
    return [
        {
            "proposal_type": "static_tree",
            "initial_branching_factor": initial,
            "branching_factor": branching,
            "depth": depth,
        },
        greedy,
    ]


def read_pin(config: dict[str, Any] | None) -> dict[str, Any] | None:
    block = (config or {}).get(PAIRREG_KEY)
    return block if isinstance(block, dict) and block.get("format") == PIN_FORMAT else None


def pinned_config(
    config: dict[str, Any],
    *,
    verifier_name: str,
    verifier_architectures: list[str],
    verifier_revision: str | None,
    verifier_manifest_digest: str,
    verifier_tokenizer_digest: str | None,
    pair_digest: str,
    method: str,
    k: int,
    tree: dict[str, Any] | None,
) -> dict[str, Any]:
    """The drafter's config.json with the verifier named *and* pinned, and the proposal
    set to the pair's speculation config. Everything else in the config is kept as is."""
    out = copy.deepcopy(config)
    spec = out.get("speculators_config")
    if not isinstance(spec, dict):
        spec = {}
    spec["algorithm"] = spec.get("algorithm") or method
    methods = proposal_methods_for(k, tree)
    spec["proposal_methods"] = methods
    spec["default_proposal_method"] = methods[0]["proposal_type"]
    spec["verifier"] = {"name_or_path": verifier_name, "architectures": verifier_architectures}
    out["speculators_config"] = spec
    model_type = get_method(method).speculators_model_type if method in TABLE else None
    if "speculators_model_type" not in out and model_type:
        out["speculators_model_type"] = model_type
    out[PAIRREG_KEY] = {
        "format": PIN_FORMAT,
        "verifier": {
            "name_or_path": verifier_name,
            "revision": verifier_revision,
            "manifest_digest": verifier_manifest_digest,
            "tokenizer_digest": verifier_tokenizer_digest,
        },
        "pair_digest": pair_digest,
        "method": method,
        "num_speculative_tokens": k,
        "tree": tree,
    }
    return out


def facts(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """What pairreg records about a speculators config (None when it is not one)."""
    spec = spec_block(config)
    if config is None or (spec is None and "speculators_model_type" not in config):
        return None
    spec = spec or {}
    verifier = spec.get("verifier") if isinstance(spec.get("verifier"), dict) else {}
    archs = verifier.get("architectures")
    prop = default_proposal(spec)
    proposal = proposal_from_config(config)
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    layer = config.get("transformer_layer_config")
    pin = read_pin(config)
    return {
        "model_type": config.get("speculators_model_type"),
        "version": config.get("speculators_version"),
        "algorithm": spec.get("algorithm"),
        "default_proposal_method": spec.get("default_proposal_method"),
        "proposal_methods": [m for m in spec.get("proposal_methods") or [] if isinstance(m, dict)],
        "speculative_tokens": _int((prop or {}).get("speculative_tokens")),
        "verifier": {
            "name_or_path": verifier.get("name_or_path")
            if isinstance(verifier.get("name_or_path"), str)
            else None,
            "architectures": [a for a in archs if isinstance(a, str)]
            if isinstance(archs, list)
            else [],
        },
        "draft_vocab_size": _int(config.get("draft_vocab_size")),
        "target_hidden_size": _int(config.get("target_hidden_size")),
        "aux_layer_ids": [i for i in aux if _int(i) is not None] if isinstance(aux, list) else None,
        "layer_hidden_size": _int(layer.get("hidden_size")) if isinstance(layer, dict) else None,
        "proposal": {
            "method": proposal.method,
            "k": proposal.k,
            "tree": proposal.tree,
            "warnings": proposal.warnings,
        },
        "pin": pin,
    }


def write_export(
    config: Mapping[str, Any],
    files: Iterable[str],
    out_dir: str | os.PathLike[str],
    source_dir: str | os.PathLike[str],
    manifest: Iterable[Mapping[str, Any]],
) -> list[str]:
    """Write an exported speculators draft: ``config.json`` from ``config`` plus ``files``
    copied from ``source_dir``, each checked against its ``manifest`` entry after the copy
    (a file that differs is removed and reported). Returns the paths written."""
    from registry.artifacts.manifest import hash_file
    from registry.errors import InvalidInput

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_path = {str(e["path"]): e for e in manifest}
    written = []
    for rel in files:
        entry = by_path.get(rel)
        src = Path(source_dir) / rel
        if entry is None or not src.is_file():
            raise InvalidInput(
                f"{rel}: not in the drafter manifest or not in {source_dir}", field="pair"
            )
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        if hash_file(dst).sha256 != entry["sha256"]:
            dst.unlink()
            raise InvalidInput(f"{src} differs from the drafter registered manifest", field="pair")
        written.append(rel)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return ["config.json", *written]
