"""fp32 greedy: speculative output == plain greedy == transformers generate(), token for
token, for every drafter."""

from __future__ import annotations

import pytest
import torch

from runner import MeasureSettings, load_suite, measure_pair, plain_greedy
from runner.drafters import DraftModelDrafter, MedusaDrafter, PromptLookupDrafter
from runner.engine import DecodeOptions, SpeculativeEngine
from runner.measure import encode_prompt
from runner.medusa import load_medusa
from runner.models import CachedLM, eos_ids, load_causal_lm, load_tokenizer

MAX_NEW = 40


@pytest.fixture(scope="module")
def setup(tiny):
    tok = load_tokenizer(tiny.target_v1)
    target = load_causal_lm(tiny.target_v1, "cpu")
    prompts = [
        load_suite("code").prompts[0],
        load_suite("code").prompts[6],
        load_suite("rag").prompts[0],
    ]
    ids = [encode_prompt(tok, p.prompt) for p in prompts]
    refs = []
    with torch.inference_mode():
        for p in ids:
            x = torch.tensor([p])
            seq = target.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                pad_token_id=tok.pad_token_id,
            )
            refs.append(seq[0, len(p) :].tolist())
    return tok, target, ids, refs


def test_plain_greedy_matches_generate(setup):
    _, target, ids, refs = setup
    for p, ref in zip(ids, refs, strict=True):
        assert plain_greedy(target, p, MAX_NEW) == ref


@pytest.mark.parametrize("method", ["draft_model", "prompt_lookup", "medusa"])
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_equals_plain_greedy(tiny, setup, method, k):
    tok, target, ids, refs = setup
    if method == "draft_model":
        drafter = DraftModelDrafter(load_causal_lm(tiny.draft, "cpu"), None)
    elif method == "prompt_lookup":
        drafter = PromptLookupDrafter(max_ngram=3)
    else:
        drafter = MedusaDrafter(load_medusa(tiny.medusa), None, None)
    engine = SpeculativeEngine(
        target, drafter, DecodeOptions(k=k, max_new_tokens=MAX_NEW), eos_ids(target, tok)
    )
    for p, ref in zip(ids, refs, strict=True):
        run = engine.generate(p)
        assert run.output_ids == ref
        assert run.emitted == len(ref)
        assert run.accepted + run.rejections <= run.drafted
        assert sum(run.accepted_per_position) == run.accepted


def test_measure_pair_greedy_outputs_match(tiny, setup):
    _, _, ids, refs = setup
    prompts = [load_suite("code").prompts[0]]
    res = measure_pair(
        tiny.target_v1,
        tiny.draft,
        prompts,
        MeasureSettings(method="draft_model", k=3, max_new_tokens=MAX_NEW, device="cpu"),
    )
    assert res.prompts[0]["output_ids"] == refs[0]
    assert res.lossy is False


def test_fast_path_matches_model_forward(setup, monkeypatch):
    _, target, ids, _ = setup
    fast = CachedLM(target)
    monkeypatch.setenv("PAIRREG_RUNNER_SLOW_PATH", "1")
    slow = CachedLM(target)
    assert fast._fast and not slow._fast
    with torch.inference_mode():
        p = torch.tensor(ids[0])
        a, _ = fast.forward(p)
        b, _ = slow.forward(p)
        assert torch.equal(a, b)
        nxt = torch.tensor([int(a[-1].argmax()), 5, 6])
        a2, _ = fast.forward(nxt)
        b2, _ = slow.forward(nxt)
        assert torch.equal(a2, b2)


def _random_llama(config_dir: str, seed: int):
    """An untrained model with the tiny architecture: its greedy output is varied, unlike the
    trained tiny models that settle into whitespace loops, and a random drafter disagrees
    with it often, so rejection, cache rollback and the bonus token all get exercised."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    config.initializer_range = 0.5  # the default 0.02 gives one argmax for every position
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_equals_plain_greedy_with_frequent_rejections(tiny, setup, k):
    tok, _, ids, _ = setup
    target = _random_llama(tiny.target_v1, seed=11)
    draft = _random_llama(tiny.draft, seed=12)
    engine = SpeculativeEngine(
        target,
        DraftModelDrafter(draft, None),
        DecodeOptions(k=k, max_new_tokens=MAX_NEW),
        eos_ids(target, tok),
    )
    total_rejections = 0
    for p in ids:
        ref = plain_greedy(target, p, MAX_NEW)
        assert len(set(ref)) > 5, "reference output is degenerate; the check would be weak"
        run = engine.generate(p)
        assert run.output_ids == ref
        total_rejections += run.rejections
    assert total_rejections >= len(ids)
