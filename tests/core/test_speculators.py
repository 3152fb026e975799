"""The speculators format: facts and pair proposals from published-shaped configs, the
pinned export and its round trip, tree shapes in the digest, heads against the wrong target,
and serving-engine arguments for EAGLE chains and trees."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from registry.artifacts import speculators
from registry.db import session_scope
from registry.errors import InvalidInput
from registry.services import exports, pairs
from registry.tables import Artifact, Pair
from tests.core.conftest import CliResult
from tests.core.test_artifacts import add
from tests.fixtures import write_fake_model

VERIFIER = "meta-llama/Llama-3.1-8B-Instruct"
LAYER = {
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 1,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
}
# shaped like RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3's config.json
REDHAT_EAGLE3 = {
    "architectures": ["Eagle3Speculator"],
    "auto_map": {"": "eagle3.Eagle3SpeculatorConfig"},
    "draft_vocab_size": 32000,
    "norm_before_residual": False,
    "speculators_config": {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {
                "accept_tolerance": 0.0,
                "proposal_type": "greedy",
                "speculative_tokens": 3,
                "verifier_accept_k": 1,
            }
        ],
        "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": VERIFIER},
    },
    "speculators_model_type": "eagle3",
    "speculators_version": "0.1.0.dev13",
    "target_hidden_size": None,
    "torch_dtype": "bfloat16",
    "transformer_layer_config": LAYER,
    "transformers_version": "4.52.4",
}
# a converted yuhuili EAGLE-3 head: pinned aux layers, norm before residual, EAGLE-2 tree
YUHUILI_EAGLE3 = {
    **copy.deepcopy(REDHAT_EAGLE3),
    "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
    "norm_before_residual": True,
    "target_hidden_size": 4096,
    "speculators_config": {
        "algorithm": "eagle3",
        "default_proposal_method": "dynamic_tree",
        "proposal_methods": [
            {
                "proposal_type": "dynamic_tree",
                "speculative_tokens": 60,
                "expansion_factor": 10,
                "depth": 6,
            },
            {"proposal_type": "greedy", "speculative_tokens": 5},
        ],
        "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": VERIFIER},
    },
}


def _head_dir(path: Path, config: dict[str, Any]) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "model.safetensors").write_bytes(b"eagle3-weights-" + path.name.encode())
    return path


def _target(path: Path, layers: int = 32, hidden: int = 4096, weights: bytes = b"t") -> Path:
    return write_fake_model(
        path,
        hidden_size=hidden,
        vocab_size=128256,
        weights=weights,
        config_extra={"num_hidden_layers": layers},
    )


def test_published_eagle3_config_proposes_and_round_trips_pinned(
    url: str, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    add(cli, _target(tmp_path / "t1"), VERIFIER, "target")
    head = add(cli, _head_dir(tmp_path / "e3", REDHAT_EAGLE3), "redhat/e3", "heads")["artifact"]
    spec = head["facts"]["speculators"]
    assert spec["algorithm"] == "eagle3" and spec["speculative_tokens"] == 3
    assert spec["verifier"] == {"name_or_path": VERIFIER, "architectures": ["LlamaForCausalLM"]}
    assert spec["draft_vocab_size"] == 32000 and head["facts"]["hidden_size"] == 4096

    with session_scope(url) as s:
        prop = pairs.propose_pair(s, draft="redhat/e3@v1")
    assert prop.registrable and prop.errors == [] and prop.warnings == []
    assert (prop.method, prop.k, prop.options) == ("eagle3", 3, {})
    assert prop.target is not None and prop.target.ref == f"{VERIFIER}@v1"

    with session_scope(url) as s:
        pair = pairs.register_pair(
            s, target=prop.target.ref, draft="redhat/e3@v1", method="eagle3", k=3, actor="t"
        ).pair
        out = exports.export_speculators(s, pair=pair.pair_digest)
    cfg = out.config
    # everything vLLM reads is kept as published; only the proposal and the pin are pairreg's
    for key in ("transformer_layer_config", "draft_vocab_size", "norm_before_residual",
                "speculators_model_type", "architectures", "auto_map"):  # fmt: skip
        assert cfg[key] == REDHAT_EAGLE3[key], key
    verifier = cfg["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": VERIFIER, "architectures": ["LlamaForCausalLM"]}
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    pin = cfg["pairreg"]
    assert pin["verifier"]["manifest_digest"] == pair.target.manifest_digest
    assert pin["verifier"]["revision"] is None  # a local target has no Hub commit
    assert (pin["pair_digest"], pin["method"], pin["num_speculative_tokens"]) == (
        pair.pair_digest, "eagle3", 3,
    )  # fmt: skip
    assert out.files == ["model.safetensors"]

    # write it out, register the exported draft: pairreg reads its pin back
    with session_scope(url) as s:
        drafter = s.get(Artifact, pair.drafter.id)
        written = speculators.write_export(
            out.config, out.files, tmp_path / "exported", tmp_path / "e3", drafter.manifest
        )
    assert written == ["config.json", "model.safetensors"]
    back = add(cli, tmp_path / "exported", "acme/e3-pinned", "heads")["artifact"]
    assert back["facts"]["speculators"]["pin"] == pin
    # a second target version with the same name: only the pin tells them apart
    add(cli, _target(tmp_path / "t2", weights=b"t2"), VERIFIER, "target")
    with session_scope(url) as s:
        again = pairs.propose_pair(s, draft="acme/e3-pinned@v1")
        by_name = pairs.propose_pair(s, draft="redhat/e3@v1")
        other = pairs.propose_pair(s, draft="acme/e3-pinned@v1", target=f"{VERIFIER}@v2")
    assert again.target is not None and again.target.ref == f"{VERIFIER}@v1"
    assert (again.method, again.k, again.options) == (prop.method, prop.k, prop.options)
    assert by_name.target is not None and by_name.target.ref == f"{VERIFIER}@v2"  # newest
    assert other.registrable and any("exported pinned to target manifest" in w
                                     for w in other.warnings)  # fmt: skip
    with session_scope(url) as s:
        re_pair = pairs.register_pair(
            s, target=again.target.ref, draft="acme/e3-pinned@v1", method="eagle3", k=3,
            actor="t",
        ).pair  # fmt: skip
        re_out = exports.export_speculators(s, pair=re_pair.pair_digest)
    assert re_pair.config == pair.config
    assert re_out.config["pairreg"]["verifier"] == pin["verifier"]
    assert {k: v for k, v in re_out.config.items() if k != "pairreg"} == {
        k: v for k, v in cfg.items() if k != "pairreg"
    }


def test_dynamic_tree_proposal_is_part_of_the_digest(
    url: str, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    add(cli, _target(tmp_path / "t"), VERIFIER, "target")
    add(cli, _head_dir(tmp_path / "y", YUHUILI_EAGLE3), "yuhuili/e3", "heads")
    with session_scope(url) as s:
        prop = pairs.propose_pair(s, draft="yuhuili/e3@v1")
    tree = {"kind": "dynamic", "top_k": 10, "total_tokens": 60}
    assert prop.registrable and (prop.method, prop.k, prop.options) == ("eagle3", 6, {"tree": tree})
    with session_scope(url) as s:
        tree_pair = pairs.register_pair(
            s, target=f"{VERIFIER}@v1", draft="yuhuili/e3@v1", method="eagle3", k=6,
            options={"tree": {"top_k": 10, "total_tokens": 60}}, actor="t",
        ).pair  # fmt: skip
        chain_pair = pairs.register_pair(
            s, target=f"{VERIFIER}@v1", draft="yuhuili/e3@v1", method="eagle3", k=6, actor="t"
        ).pair
        out = exports.export_speculators(s, pair=tree_pair.pair_digest)
    assert tree_pair.config["tree"] == tree and chain_pair.config["tree"] is None
    assert tree_pair.pair_digest != chain_pair.pair_digest
    methods = out.config["speculators_config"]["proposal_methods"]
    assert methods[0] == {"proposal_type": "dynamic_tree", "speculative_tokens": 60,
                          "expansion_factor": 10, "depth": 6}  # fmt: skip
    assert out.config["speculators_config"]["default_proposal_method"] == "dynamic_tree"
    assert speculators.proposal_from_config(out.config).tree == tree


def test_tree_config_normalisation() -> None:
    norm = pairs.normalise_config
    static = norm("medusa", 2, {"tree": {"choices": [[1], [0, 0], [0]]}})
    assert static["tree"] == {"kind": "static", "choices": [[0], [1], [0, 0]]}
    assert "tree" not in norm("medusa", 2, {})  # medusa chains keep their old digests
    assert norm("eagle", 3, {})["tree"] is None
    for options, needle in (
        ({"tree": {"choices": [[0], [1, 0]]}}, "parent"),
        ({"tree": {"choices": [[0], [0]]}}, "twice"),
        ({"tree": {"choices": [[0]]}}, "for a tree k is its depth"),
        ({"tree": {"top_k": 4, "total_tokens": 10}}, "static tree"),
        ({"tree": {"choices": [[0], [0, 0]], "width": 3}}, "unknown key tree.width"),
    ):
        with pytest.raises(InvalidInput, match=needle):
            norm("medusa", 2, options)
    with pytest.raises(InvalidInput, match="unknown config key 'tree'"):
        norm("draft_model", 2, {"tree": {"choices": [[0], [0, 0]]}})
    with pytest.raises(InvalidInput, match="strict rule only"):
        norm("eagle", 2, {"tree": {"top_k": 2, "total_tokens": 4}, "acceptance": "typical"})
    with pytest.raises(InvalidInput, match="tree.top_k"):
        norm("eagle3", 2, {"tree": {"top_k": 0, "total_tokens": 4}})


def test_speculators_static_tree_and_branching_round_trip() -> None:
    choices = speculators.static_choices(3, 2, 3)
    assert len(choices) == 3 + 6 + 12 and choices[:4] == [[0], [1], [2], [0, 0]]
    assert speculators.branching_of(choices) == (3, 2, 3)
    assert speculators.branching_of([[0], [1], [0, 0]]) is None  # not a full branching tree
    methods = speculators.proposal_methods_for(3, {"kind": "static", "choices": choices})
    assert methods[0] == {"proposal_type": "static_tree", "initial_branching_factor": 3,
                          "branching_factor": 2, "depth": 3}  # fmt: skip
    cfg = {"speculators_model_type": "eagle", "speculators_config": {
        "proposal_methods": methods, "default_proposal_method": "static_tree"}}  # fmt: skip
    prop = speculators.proposal_from_config(cfg)
    assert (prop.method, prop.k, prop.tree) == ("eagle", 3, {"kind": "static", "choices": choices})


def test_head_against_the_wrong_target_is_flagged_or_refused(
    url: str, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    add(cli, _target(tmp_path / "other", weights=b"o"), "acme/other-8b", "target")
    add(cli, _target(tmp_path / "narrow", hidden=2048, weights=b"n"), "acme/narrow", "target")
    add(cli, _target(tmp_path / "shallow", layers=12, weights=b"s"), "acme/shallow", "target")
    add(cli, _head_dir(tmp_path / "y", YUHUILI_EAGLE3), "yuhuili/e3", "heads")
    with session_scope(url) as s:
        prop = pairs.propose_pair(s, draft="yuhuili/e3@v1")
        assert prop.target is None and not prop.registrable  # nothing named like its verifier
        named_other = pairs.propose_pair(s, draft="yuhuili/e3@v1", target="acme/other-8b@v1")
        assert named_other.registrable
        assert any(f"declares intended target {VERIFIER}" in w for w in named_other.warnings)
        # a name mismatch is a finding: registered with a warning, refused when strict
        ok = pairs.register_pair(
            s, target="acme/other-8b@v1", draft="yuhuili/e3@v1", method="eagle3", k=6, actor="t"
        )
        assert any("declares intended target" in w for w in ok.pair.warnings)
        with pytest.raises(InvalidInput, match="declares intended target"):
            pairs.register_pair(s, target="acme/other-8b@v1", draft="yuhuili/e3@v1",
                                method="eagle3", k=5, strict=True, actor="t")  # fmt: skip
        for target, needle in (
            ("acme/narrow@v1", "hidden size mismatch: heads read 4096, target has 2048"),
            ("acme/shallow@v1", "layer count mismatch"),
        ):
            with pytest.raises(InvalidInput, match=needle):
                pairs.register_pair(
                    s, target=target, draft="yuhuili/e3@v1", method="eagle3", k=6, actor="t"
                )
        with pytest.raises(InvalidInput, match="register it with method eagle3"):
            pairs.register_pair(
                s, target="acme/other-8b@v1", draft="yuhuili/e3@v1", method="eagle", k=6,
                actor="t",
            )  # fmt: skip


def _pair(method: str, k: int, tree: dict | None, commit: str = "c" * 40) -> Pair:
    target = Artifact(lineage="acme/t", version=1, source_kind="hf", hub_repo="acme/t",
                      hub_commit="a" * 40, source="hf://acme/t@" + "a" * 40)  # fmt: skip
    heads = Artifact(lineage="acme/h", version=1, source_kind="hf", hub_repo="acme/h",
                     hub_commit=commit, source="hf://acme/h@" + commit)  # fmt: skip
    config = pairs.normalise_config(method, k, {"tree": tree} if tree else {})
    return Pair(target=target, drafter=heads, method=method, k=k, config=config,
                pair_digest="f" * 64)  # fmt: skip


def test_engine_exports_for_eagle_chains_and_trees() -> None:
    args, spec = exports.vllm_args(_pair("eagle3", 3, None), "prod")
    assert spec == {"method": "eagle3", "model": "acme/h", "revision": "c" * 40,
                    "num_speculative_tokens": 3}  # fmt: skip
    static = {"choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]}
    _, spec = exports.vllm_args(_pair("eagle", 3, static), "prod")
    assert spec["speculative_token_tree"] == "[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]"
    assert spec["num_speculative_tokens"] == 5  # vLLM: one draft token per tree node
    dynamic = {"top_k": 4, "total_tokens": 15}
    with pytest.raises(InvalidInput, match="vLLM has no dynamic"):
        exports.vllm_args(_pair("eagle3", 5, dynamic), "prod")
    g = exports.sglang_args(_pair("eagle3", 5, dynamic), "prod")
    assert g[g.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert g[g.index("--speculative-num-steps") + 1] == "5"
    assert g[g.index("--speculative-eagle-topk") + 1] == "4"
    assert g[g.index("--speculative-num-draft-tokens") + 1] == "16"
    g = exports.sglang_args(_pair("eagle", 4, None), "prod")
    assert (g[g.index("--speculative-algorithm") + 1], g[g.index("--speculative-eagle-topk") + 1],
            g[g.index("--speculative-num-draft-tokens") + 1]) == ("EAGLE", "1", "5")  # fmt: skip
    with pytest.raises(InvalidInput, match="no static tree choices"):
        exports.sglang_args(_pair("eagle", 3, static), "prod")
    with pytest.raises(InvalidInput, match="vLLM has no Medusa trees"):
        exports.vllm_args(_pair("medusa", 3, static), "prod")
    with pytest.raises(InvalidInput, match="no pinned Hub source"):
        exports.vllm_args(_pair("eagle3", 3, None, commit="main"), "prod")
