"""Teacher-forced overlap: a deterministic, cheap drift signal.

Frozen continuations (token ids) are fed through two models; at every continuation
position we take beta = sum_x min(p_a(x), p_b(x)) (= 1 - total variation), the expected
acceptance of speculative sampling at that position. Comparing draft-vs-old-target with
draft-vs-new-target on the same continuations shows drift without any sampling noise;
old-vs-new target shows how far the target itself moved.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from runner.engine import greedy_decode
from runner.models import eos_ids, load_causal_lm, load_tokenizer, resolve_device
from runner.render import encode_prompt
from runner.suites import Prompt

Item = tuple[Sequence[int], Sequence[int]]


def _model(m: Any, device: torch.device):
    if isinstance(m, str | os.PathLike):
        return load_causal_lm(m, device)
    return m


@torch.inference_mode()
def teacher_forced_overlap(
    model_a_dir: Any,
    model_b_dir: Any,
    items: Sequence[Item],
    device: str = "auto",
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Mean sum-min(p_a, p_b) per continuation position and overall.

    ``items``: ``(prompt_ids, continuation_ids)`` pairs. Models are directories or loaded
    causal LMs with the same vocabulary. Returns ``mean`` (over all positions),
    ``per_position`` (mean by index within the continuation), ``per_item`` (mean per item,
    for paired comparisons across prompts) and ``positions`` (count).
    """
    dev = resolve_device(device)
    a = _model(model_a_dir, dev)
    b = _model(model_b_dir, dev)
    per_item: list[float | None] = []
    pos_sum: list[float] = []
    pos_cnt: list[int] = []
    total, count = 0.0, 0
    for prompt_ids, cont in items:
        cont = list(cont)
        if not cont:
            per_item.append(None)
            continue
        ids = torch.tensor([*prompt_ids, *cont], device=dev).view(1, -1)
        start = len(prompt_ids) - 1  # logits at this index predict cont[0]
        la = a(input_ids=ids, use_cache=False).logits[0, start : start + len(cont)].float()
        lb = b(input_ids=ids, use_cache=False).logits[0, start : start + len(cont)].float()
        pa = torch.softmax(la / temperature, dim=-1)
        pb = torch.softmax(lb / temperature, dim=-1)
        betas = torch.minimum(pa, pb).sum(dim=-1).tolist()
        per_item.append(sum(betas) / len(betas))
        for j, beta in enumerate(betas):
            if j >= len(pos_sum):
                pos_sum.append(0.0)
                pos_cnt.append(0)
            pos_sum[j] += beta
            pos_cnt[j] += 1
        total += sum(betas)
        count += len(betas)
    return {
        "mean": total / count if count else None,
        "per_position": [s / c for s, c in zip(pos_sum, pos_cnt, strict=True)],
        "per_item": per_item,
        "positions": count,
        "temperature": temperature,
    }


def greedy_continuations(
    target_dir: Any,
    prompts: Sequence[Prompt | str | Sequence[int]],
    max_new_tokens: int = 32,
    device: str = "auto",
) -> list[tuple[list[int], list[int]]]:
    """Freeze continuations by greedy decoding with ``target_dir`` (a dir or loaded
    model; with a loaded model pass token-id prompts). Returns ``(prompt_ids, cont_ids)``."""
    dev = resolve_device(device)
    tokenizer = load_tokenizer(target_dir) if isinstance(target_dir, str | os.PathLike) else None
    model = _model(target_dir, dev)
    eos = eos_ids(model, tokenizer)
    out: list[tuple[list[int], list[int]]] = []
    for p in prompts:
        if isinstance(p, Prompt | str):
            if tokenizer is None:
                raise ValueError("text prompts need a model directory (for its tokenizer)")
            ids = encode_prompt(tokenizer, p)
        else:
            ids = list(p)
        out.append((ids, greedy_decode(model, ids, max_new_tokens, eos)))
    return out
