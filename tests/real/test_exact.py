"""fp32 greedy on the real pair: the engine's output is exactly target-v1's own
``generate()`` on the same ids, with and without its draft (a chat-rendered prompt and a
raw one)."""

from __future__ import annotations

import pytest
import torch

from runner.drafters import DraftModelDrafter
from runner.engine import DecodeOptions, SpeculativeEngine
from runner.models import eos_ids, load_causal_lm, load_tokenizer

pytestmark = pytest.mark.real
MAX_NEW = 24


def test_engine_equals_generate(real) -> None:  # type: ignore[no-untyped-def]
    tok = load_tokenizer(real.target_v1)
    target = load_causal_lm(real.target_v1)
    draft = load_causal_lm(real.draft)
    eos = eos_ids(target, tok)
    chat = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    prompts = [
        list(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]),
        list(tok("def fibonacci(n):\n    if n < 2:\n")["input_ids"]),
    ]
    plain = SpeculativeEngine(target, None, DecodeOptions(k=0, max_new_tokens=MAX_NEW), eos)
    spec = SpeculativeEngine(
        target, DraftModelDrafter(draft, None), DecodeOptions(k=4, max_new_tokens=MAX_NEW), eos
    )
    for ids in prompts:
        with torch.inference_mode():
            seq = target.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        ref = seq[0, len(ids) :].tolist()
        assert plain.generate(ids).output_ids == ref
        run = spec.generate(ids)
        assert run.output_ids == ref
        assert run.accepted > 0  # the draft is useful, not only harmless
