"""The real pair's EAGLE-1 and EAGLE-3 reference heads: the speculators files name the
verifier and the recipe, the heads load with the runner, fp32 greedy output with each head
(chain and an EAGLE-2 dynamic tree) is exactly target-v1's own ``generate()`` on chat
prompts, and the heads register as drafts against target-v1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from builders.real import read_build_manifest
from builders.real_heads import HEADS_RECIPE, VERIFIER, heads_built
from registry.artifacts.manifest import build_manifest
from runner.eagle import load_eagle
from runner.eagle_drafter import EagleDrafter
from runner.engine import DecodeOptions, SpeculativeEngine
from runner.models import eos_ids, load_causal_lm, load_tokenizer
from runner.tree import DynamicTree

pytestmark = pytest.mark.real
MAX_NEW = 24
TREE = {"kind": "dynamic", "top_k": 4, "total_tokens": 16}  # small: CPU time
PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a haiku about autumn leaves.",
)


@pytest.fixture(scope="module")
def setup(real, real_heads):  # type: ignore[no-untyped-def]
    tok = load_tokenizer(real.target_v1)
    target = load_causal_lm(real.target_v1)
    ids = [
        list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                     tokenize=True)["input_ids"])
        for p in PROMPTS
    ]  # fmt: skip
    refs = []
    for p in ids:
        with torch.inference_mode():
            seq = target.generate(
                torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        refs.append(seq[0, len(p) :].tolist())
    return tok, target, ids, refs


def test_heads_files_name_the_verifier_and_the_recipe(real, real_heads) -> None:  # type: ignore[no-untyped-def]
    assert heads_built(real.root)
    meta = json.loads(Path(real_heads.marker).read_text())
    assert meta["heads_recipe"] == HEADS_RECIPE
    digests = read_build_manifest(real.root)["manifest_digests"]
    assert meta["trained_against"] == digests["target-v1"]
    assert meta["data"]["same_as_build_answers"]  # trained on the build's own answers set
    for name, kind in (("eagle", "eagle"), ("eagle3", "eagle3")):
        path = getattr(real_heads, name)
        cfg = json.loads((Path(path) / "config.json").read_text())
        assert cfg["speculators_model_type"] == kind
        assert cfg["speculators_config"]["verifier"] == VERIFIER
        assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
        assert build_manifest(path).digest == meta["manifest_digests"][name]
    cfg3 = json.loads((Path(real_heads.eagle3) / "config.json").read_text())
    assert cfg3["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM's default for 30
    assert cfg3["draft_vocab_size"] == HEADS_RECIPE["draft_vocab_size"]
    head = load_eagle(real_heads.eagle3)
    assert int(head.t2d.sum()) == HEADS_RECIPE["draft_vocab_size"]
    assert torch.equal(head.t2d.nonzero().flatten(), head.draft_ids)  # d2t and t2d agree


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "eagle2"])
def test_heads_greedy_equals_target_generate(real_heads, setup, version, tree) -> None:  # type: ignore[no-untyped-def]
    tok, target, ids, refs = setup
    head = load_eagle(real_heads.eagle if version == 1 else real_heads.eagle3)
    shape = DynamicTree(top_k=tree["top_k"], total_tokens=tree["total_tokens"]) if tree else None
    engine = SpeculativeEngine(
        target, EagleDrafter(head, target, None, None, shape),
        DecodeOptions(k=4, max_new_tokens=MAX_NEW), eos_ids(target, tok),
    )  # fmt: skip
    accepted = 0
    for p, ref in zip(ids, refs, strict=True):
        run = engine.generate(p)
        assert run.output_ids == ref
        accepted += run.accepted
    assert accepted > 0  # the head is useful, not only harmless


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_heads_register_against_target_v1(home, cli, real, real_heads) -> None:  # type: ignore[no-untyped-def]
    def ok(*args: str):  # type: ignore[no-untyped-def]
        r = cli(*args, "--json")
        assert r.rc == 0, r.out + r.err
        return r.json()

    ok("artifact", "add", real.target_v1, "--name", VERIFIER["name_or_path"], "--role", "target")
    for name, method, extra in (
        ("eagle", "eagle", ()),
        ("eagle3", "eagle3", ("--set", f"tree={json.dumps(TREE)}")),
    ):
        path = getattr(real_heads, name)
        ok("artifact", "add", path, "--name", f"real/{name}", "--role", "heads")
        pair = ok("pair", "register", "--target", "real/target-v1@v1", "--draft",
                  f"real/{name}@v1", "--method", method, "--k", "4", *extra)["pair"]  # fmt: skip
        assert pair["warnings"] == []
        assert pair["config"]["method"] == method
    assert pair["config"]["tree"] == TREE


def test_cli_heads_flag_reuses_both_stages(real, real_heads, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("real", "build", "--out", real.root, "--heads")
    assert r.rc == 0, r.err
    assert "already built" in r.out and "heads already built" in r.out
    digests = json.loads(Path(real_heads.marker).read_text())["manifest_digests"]
    assert digests["eagle"][:16] in r.out and digests["eagle3"][:16] in r.out
