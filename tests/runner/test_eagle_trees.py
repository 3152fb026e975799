"""EAGLE-1 / EAGLE-3 heads and token trees on the tiny target: fp32 greedy output equals
plain greedy decoding for every drafter and tree shape (trained heads, and untrained heads
on an untrained target, where most candidates are rejected); counters add up; the
speculators files carry vLLM's weight names and load back to the same head; a tree pass
keeps exactly the accepted path in the cache."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from builders.tiny import medusa_tree
from registry.artifacts import speculators
from registry.artifacts.model_facts import read_model_facts
from runner import MeasureSettings, load_suite, measure_pair, plain_greedy
from runner.drafters import MedusaDrafter
from runner.eagle import EagleHead, load_eagle, spec_for_target
from runner.eagle_drafter import EagleDrafter
from runner.engine import DecodeOptions, SpeculativeEngine
from runner.measure import encode_prompt
from runner.medusa import load_medusa
from runner.models import CachedLM, eos_ids, load_causal_lm, load_tokenizer, tree_mask
from runner.stats import summarize_group
from runner.tree import DynamicTree, StaticTree, tree_shape

MAX_NEW = 40
EOS = 258
STATIC = StaticTree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)))
DYNAMIC = DynamicTree(top_k=3, total_tokens=10)


@pytest.fixture(scope="module")
def setup(tiny):
    tok = load_tokenizer(tiny.target_v1)
    target = load_causal_lm(tiny.target_v1, "cpu")
    prompts = [load_suite("code").prompts[0], load_suite("rag").prompts[0]]
    ids = [encode_prompt(tok, p.prompt) for p in prompts]
    refs = [plain_greedy(target, p, MAX_NEW) for p in ids]
    return tok, target, ids, refs


def _check_counters(run, k: int) -> None:
    apos, vpos = run.accepted_per_position, run.verified_per_position
    assert sum(apos) == run.accepted and len(apos) == k
    assert all(a <= v for a, v in zip(apos, vpos, strict=True))
    assert all(apos[i] >= apos[i + 1] for i in range(k - 1))
    # each level the walk tried is either accepted or the step's one rejection
    assert run.rejections <= run.steps and run.accepted + run.rejections == sum(vpos)
    if EOS not in run.output_ids:
        # tau from the counters: every decoding call emits its accepted tokens plus one
        assert run.emitted - 1 == run.accepted + run.target_calls - 1
    g = summarize_group([run.to_dict()], k, n_boot=10)
    assert g["tau"] == pytest.approx((run.emitted - 1) / (run.target_calls - 1))
    assert g["vllm"] == run.vllm_counters()


def _eagle(tiny, version: int, target, tree):
    head = load_eagle(tiny.eagle if version == 1 else tiny.eagle3)
    return EagleDrafter(head, target, None, None, tree)


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("tree", [None, DYNAMIC, STATIC], ids=["chain", "eagle2", "static"])
def test_trained_eagle_heads_equal_plain_greedy(tiny, setup, version, tree):
    tok, target, ids, refs = setup
    engine = SpeculativeEngine(
        target, _eagle(tiny, version, target, tree), DecodeOptions(k=4, max_new_tokens=MAX_NEW),
        eos_ids(target, tok),
    )  # fmt: skip
    accepted = 0
    for p, ref in zip(ids, refs, strict=True):
        run = engine.generate(p)
        assert run.output_ids == ref
        _check_counters(run, 4)
        accepted += run.accepted
        if tree is not None:
            assert run.drafted > 4 * run.steps * 0.9  # more candidates than a chain checks
    assert accepted > 0  # trained heads do get tokens accepted


def test_medusa_tree_equals_plain_greedy(tiny, setup):
    tok, target, ids, refs = setup
    shape = tree_shape(medusa_tree(tiny))
    assert isinstance(shape, StaticTree) and len(shape.choices) > shape.depth
    drafter = MedusaDrafter(load_medusa(tiny.medusa), None, None, shape)
    engine = SpeculativeEngine(
        target, drafter, DecodeOptions(k=shape.depth, max_new_tokens=MAX_NEW), eos_ids(target, tok)
    )
    for p, ref in zip(ids, refs, strict=True):
        run = engine.generate(p)
        assert run.output_ids == ref
        _check_counters(run, shape.depth)


def _random_llama(config_dir: str, seed: int):
    """An untrained target with varied greedy output (see test_greedy_equivalence)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    config.initializer_range = 0.5
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("tree", [None, DYNAMIC, STATIC], ids=["chain", "eagle2", "static"])
def test_untrained_heads_mostly_rejected_still_exact(tiny, setup, version, tree):
    tok, _, ids, _ = setup
    target = _random_llama(tiny.target_v1, seed=21)
    torch.manual_seed(22)
    spec = spec_for_target(target.config, version, draft_vocab_size=128 if version == 3 else None)
    head = EagleHead(spec)
    if version == 3:  # an arbitrary reduced vocabulary: every other target id
        with torch.no_grad():
            draft_ids = torch.arange(128) * 2
            head.d2t.copy_(draft_ids - torch.arange(128))
            head.t2d[draft_ids] = True
    drafter = EagleDrafter(head.eval(), target, None, None, tree)
    engine = SpeculativeEngine(
        target, drafter, DecodeOptions(k=4, max_new_tokens=MAX_NEW), eos_ids(target, tok)
    )
    rejections = 0
    for p in ids:
        ref = plain_greedy(target, p, MAX_NEW)
        assert len(set(ref)) > 5
        run = engine.generate(p)
        assert run.output_ids == ref
        _check_counters(run, 4)
        rejections += run.rejections
        assert run.accepted < run.steps  # mostly rejected
    assert rejections >= len(ids)


def test_tree_pass_keeps_only_the_accepted_path(setup):
    _, target, ids, _ = setup
    prompt = ids[0][:20]
    with torch.inference_mode():
        lm = CachedLM(target, want_hidden=True)
        lm.forward(torch.tensor(prompt[:-1]))
        past = lm.length
        # pending token + a tree: 0:(a) 1:(b) 2:(a,c) 3:(b,d) 4:(a,c,e)
        parents = [-1, 0, 0, 1, 2, 3]
        toks = [prompt[-1], 40, 41, 42, 43, 44]
        depths = [0, 1, 1, 2, 2, 3]
        mask = tree_mask(past, parents, torch.float32, lm.device)
        pos = past + torch.tensor(depths)
        tree_logits, tree_hidden = lm.forward(torch.tensor(toks), positions=pos, mask=mask)
        lm.keep_tail(past, [0, 1, 3, 5])  # pending, a, (a,c), (a,c,e)
        after, _ = lm.forward(torch.tensor([7]))

        ref = CachedLM(target, want_hidden=True)
        seq_logits, seq_hidden = ref.forward(torch.tensor([*prompt, 40, 42, 44]))
        ref_after, _ = ref.forward(torch.tensor([7]))
    # every path row sees exactly its ancestors: same as the plain sequence
    for row, seq_row in zip([0, 1, 3, 5], range(len(prompt) - 1, len(prompt) + 3), strict=True):
        assert torch.allclose(tree_logits[row], seq_logits[seq_row], atol=1e-4)
        assert torch.allclose(tree_hidden[row], seq_hidden[seq_row], atol=1e-4)
    assert lm.length == ref.length and torch.allclose(after, ref_after, atol=1e-4)


def test_eagle3_features_come_from_the_named_layers(setup):
    _, target, ids, _ = setup
    with torch.inference_mode():
        lm = CachedLM(target, aux_layers=(1, 2, 3))
        _, feats = lm.forward(torch.tensor(ids[0][:12]))
        out = target.model(input_ids=torch.tensor([ids[0][:12]]), output_hidden_states=True)
    want = torch.cat([out.hidden_states[i][0] for i in (1, 2, 3)], dim=-1)
    assert feats.shape == (12, 3 * target.config.hidden_size)
    assert torch.allclose(feats, want, atol=1e-5)
    with pytest.raises(ValueError, match="out of range"):
        CachedLM(target, aux_layers=(1, 2, 4))


def test_speculators_files_carry_vllm_names_and_load_back(tiny, setup, tmp_path):
    _, target, ids, _ = setup
    h = target.config.hidden_size
    e1 = load_file(f"{tiny.eagle}/model.safetensors")
    assert e1["fc.weight"].shape == (h, 2 * h)
    assert "layers.0.self_attn.q_proj.weight" in e1 and "layers.0.mlp.down_proj.weight" in e1
    assert not any(
        n.startswith(("embed_tokens", "lm_head", "layers.0.input_layernorm")) for n in e1
    )
    e3 = load_file(f"{tiny.eagle3}/model.safetensors")
    assert e3["fc.weight"].shape == (h, 3 * h)
    assert e3["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * h
    assert e3["lm_head.weight"].shape == (96, h) and e3["d2t"].shape == (96,)
    assert e3["t2d"].dtype == torch.bool and int(e3["t2d"].sum()) == 96
    for name in ("layers.0.hidden_norm.weight", "layers.0.input_layernorm.weight", "norm.weight"):
        assert name in e3
    cfg = json.loads(open(f"{tiny.eagle3}/config.json").read())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 96
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "tiny/target-v1"
    assert cfg["transformer_layer_config"]["hidden_size"] == h
    facts = read_model_facts(tiny.eagle3)
    assert facts.speculators["proposal"]["method"] == "eagle3"
    assert facts.speculators["proposal"]["k"] == 4 and facts.hidden_size == h
    assert speculators.proposal_from_config(cfg).method == "eagle3"
    # save -> load gives the very same head
    head = load_eagle(tiny.eagle3).attach(target)
    head.save(tmp_path / "copy", {"name_or_path": "x", "architectures": []}, 4)
    again = load_eagle(tmp_path / "copy").attach(target)
    x = torch.randn(1, 5, h)
    ids5 = torch.tensor([ids[0][:5]])
    pos = torch.arange(5)[None]
    mask = tree_mask(0, [-1, 0, 1, 2, 3], torch.float32, torch.device("cpu"))
    with torch.no_grad():
        a = head(ids5, x, pos, mask, None)
        b = again(ids5, x, pos, mask, None)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert bool(torch.isinf(a[1][0, 0]).sum() == target.config.vocab_size - 96)


def test_eagle3_head_refuses_a_shallower_target(tiny, setup):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny.target_v1)
    config.num_hidden_layers = 3
    shallow = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="reads target layers"):
        load_eagle(tiny.eagle3).attach(shallow)


@pytest.mark.parametrize(
    "method,tree",
    [("eagle", {"kind": "dynamic", "top_k": 3, "total_tokens": 10}), ("medusa", "tiny")],
)
def test_measure_pair_with_trees_at_temperature_one(tiny, method, tree):
    if tree == "tiny":
        tree = medusa_tree(tiny)
    k = 4 if method == "eagle" else max(len(c) for c in tree["choices"])
    drafter = tiny.eagle if method == "eagle" else tiny.medusa
    prompts = load_suite("code").prompts[:2]
    res = measure_pair(
        tiny.target_v1,
        drafter,
        prompts,
        MeasureSettings(method=method, k=k, temperature=1.0, max_new_tokens=24, device="cpu",
                        tree=tree, seed=3),
    )  # fmt: skip
    o = res.overall
    assert o["draft_tokens_per_step"] > k  # a tree, not a chain
    assert 0 < o["alpha"] <= 1 and o["tau"] >= 1
    assert o["vllm"]["num_draft_tokens"] == o["counters"]["drafted"]
    for row in res.prompts:
        assert row["emitted"] == 24 or EOS in row["output_ids"]
