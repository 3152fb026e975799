"""Training EAGLE-1 and EAGLE-3 heads (and a Medusa tree) against a frozen target.

Works for any Llama-style target loadable by transformers: it only needs the target's
embedding, LM head, hidden states and config. Batches are token windows ``[B, T]`` from a
sampler the caller provides (the tiny build samples Python source; the real pair can pass
windows of its own text).

Training-time test (EAGLE-3's recipe, used for both heads here): the head is unrolled for
``ttt_steps`` steps on every window at once. Step 0 reads the target's features; step ``s``
reads the head's own output from step ``s - 1`` at the same column, exactly what it will
see when drafting ``s`` tokens ahead. Column ``i`` of step ``s`` is the pair
``(t_{i+1+s}, h)`` at position ``i + s``; it attends to the real prefix (step 0, columns
``<= i``) and to its own column in steps ``1..s`` — the keys a chain rooted at ``i`` would
have in the draft's cache. Losses (weighted ``0.8^s``): EAGLE-1 regresses the target's next
feature (smooth L1) plus a soft cross-entropy against the target's next-token distribution;
EAGLE-3 uses the soft cross-entropy over its draft vocabulary only.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F
from transformers import DynamicCache

from runner.eagle import EagleHead, HeadSpec

Batches = Callable[[], torch.Tensor]
Tick = Callable[[], None]
STEP_WEIGHT = 0.8


def _lr(step: int, steps: int, peak: float, warmup: int = 10) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _ttt_mask(n: int, step: int, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, n, (step + 1) n]``: causal over step 0, diagonal over steps 1..step."""
    allowed = torch.zeros(n, (step + 1) * n, dtype=torch.bool)
    allowed[:, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    eye = torch.eye(n, dtype=torch.bool)
    for s in range(1, step + 1):
        allowed[:, s * n : (s + 1) * n] = eye
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape)


@torch.no_grad()
def target_features(target, batch: torch.Tensor, aux_layers: tuple[int, ...] | None):
    """(post-norm last hidden ``[B, T, H]``, aux features ``[B, T, 3H]`` or None,
    logits ``[B, T, V]``) for a batch of windows."""
    out = target.model(input_ids=batch, output_hidden_states=aux_layers is not None)
    final = out.last_hidden_state
    aux = None
    if aux_layers is not None:
        aux = torch.cat([out.hidden_states[i] for i in aux_layers], dim=-1)
    return final, aux, target.lm_head(final).float()


def draft_vocabulary(target, batches: Batches, size: int, n_batches: int = 8) -> list[int]:
    """The ``size`` target ids the target predicts most often (argmax) on sample windows,
    ascending — EAGLE-3's reduced vocabulary."""
    counts = torch.zeros(int(target.config.vocab_size), dtype=torch.long)
    for _ in range(n_batches):
        _, _, logits = target_features(target, batches(), None)
        counts += torch.bincount(logits.argmax(-1).flatten(), minlength=counts.numel())
    # ties broken by id so the choice is deterministic
    order = sorted(range(counts.numel()), key=lambda i: (-int(counts[i]), i))
    return sorted(order[:size])


def new_head(spec: HeadSpec, target, draft_ids: list[int] | None = None) -> EagleHead:
    """A fresh head attached to ``target``; EAGLE-3's LM head starts from the target's
    rows for its draft vocabulary."""
    head = EagleHead(spec)
    if spec.version == 3:
        ids = torch.tensor(draft_ids if draft_ids is not None else range(spec.draft_vocab_size))
        if ids.numel() != spec.draft_vocab_size:
            raise ValueError("draft vocabulary size does not match the head spec")
        with torch.no_grad():
            head.d2t.copy_(ids - torch.arange(ids.numel()))
            head.t2d.zero_()
            head.t2d[ids] = True
            head.lm_head.weight.copy_(target.get_output_embeddings().weight[ids])
    return head.attach(target)


def train_head(
    head: EagleHead,
    target,
    batches: Batches,
    steps: int,
    *,
    lr: float = 3e-3,
    ttt_steps: int = 3,
    tick: Tick | None = None,
) -> float:
    """Train ``head`` (attached to the frozen ``target``); returns the last loss."""
    spec = head.spec
    aux = head.aux_layers(int(target.config.num_hidden_layers)) if spec.version == 3 else None
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    head.train()
    loss_val = float("nan")
    draft_ids = head.draft_ids if spec.version == 3 else None
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, lr)
        batch = batches()
        final, aux_feats, t_logits = target_features(target, batch, aux)
        b, t = batch.shape
        n = t - 1
        feats = final if spec.version == 1 else aux_feats
        hidden = head.fuse(feats[:, :-1])
        cache = DynamicCache()
        loss = torch.zeros(())
        for s in range(ttt_steps):
            valid = n - s  # columns whose label (position i + 1 + s) exists
            if valid <= 0:
                break
            ids = torch.zeros(b, n, dtype=torch.long)
            ids[:, :valid] = batch[:, 1 + s :]
            pos = (torch.arange(n) + s).expand(b, n)
            out, logits = head(ids, hidden, pos, _ttt_mask(n, s, hidden.dtype), cache)
            o, lg = out[:, :valid], logits[:, :valid]
            p_next = t_logits[:, 1 + s :]
            if spec.version == 1:
                reg = F.smooth_l1_loss(o, final[:, 1 + s :])
                ce = -(torch.softmax(p_next, -1) * torch.log_softmax(lg, -1)).sum(-1).mean()
                step_loss = reg + 0.1 * ce
            else:
                probs = torch.softmax(p_next[..., draft_ids], -1)
                step_loss = -(probs * torch.log_softmax(lg[..., draft_ids], -1)).sum(-1).mean()
            loss = loss + (STEP_WEIGHT**s) * step_loss
            hidden = out
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss_val = float(loss.detach())
        if tick is not None:
            tick()
    head.eval()
    return loss_val


# --------------------------------------------------------------------------- Medusa tree


@torch.no_grad()
def medusa_rank_accuracy(
    target, heads, batches: Batches, n_batches: int = 4, max_rank: int = 8
) -> list[list[float]]:
    """``acc[h][r]``: how often head ``h``'s rank-``r`` candidate equals the target's own
    greedy choice at that offset (teacher-forced windows)."""
    hits = torch.zeros(heads.num_heads, max_rank)
    totals = torch.zeros(heads.num_heads)
    for _ in range(n_batches):
        batch = batches()
        final, _, t_logits = target_features(target, batch, None)
        want = t_logits.argmax(-1)  # want[:, i] = target's choice for position i + 1
        logits = heads(final)  # [H, B, T, V]
        for h in range(heads.num_heads):
            shift = h + 1  # head h at position i predicts position i + 2 + h
            ranked = logits[h, :, :-shift].topk(max_rank, dim=-1).indices
            gold = want[:, shift:]
            hits[h] += (ranked == gold[..., None]).float().sum(dim=(0, 1))
            totals[h] += gold.numel()
    return (hits / totals[:, None]).tolist()


def medusa_tree_choices(accuracy: list[list[float]], n_nodes: int) -> list[list[int]]:
    """Medusa's tree construction: add, best first, the path whose expected acceptance
    (product of per-head rank accuracies along it) is largest, ``n_nodes`` times. A child's
    value never exceeds its parent's, so the result is prefix-closed."""
    depth = len(accuracy)
    heap: list[tuple[float, tuple[int, ...]]] = [(-accuracy[0][0], (0,))]
    chosen: list[tuple[int, ...]] = []
    seen = {(0,)}
    while heap and len(chosen) < n_nodes:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        value = -neg
        # next sibling (rank + 1) and first child (rank 0 one level deeper)
        cands = []
        d = len(path) - 1
        if path[-1] + 1 < len(accuracy[d]):
            sib = (*path[:-1], path[-1] + 1)
            parent_value = value / max(accuracy[d][path[-1]], 1e-12)
            cands.append((parent_value * accuracy[d][path[-1] + 1], sib))
        if d + 1 < depth:
            cands.append((value * accuracy[d + 1][0], (*path, 0)))
        for v, c in cands:
            if c not in seen:
                seen.add(c)
                heapq.heappush(heap, (-v, c))
    return [list(c) for c in sorted(chosen, key=lambda c: (len(c), c))]


# --------------------------------------------------------------------------- reference build


def train_reference_heads(
    target_dir: str,
    batches: Batches,
    *,
    eagle_dir: str | None,
    eagle3_dir: str | None,
    steps: int,
    verifier: dict[str, Any],
    k: int = 4,
    draft_vocab_size: int | None = None,
    aux_layers: list[int] | None = None,
    seed: int = 0,
    lr: float = 3e-3,
    ttt_steps: int = 3,
    tick: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Train EAGLE-1 and/or EAGLE-3 heads for the Llama-style target in ``target_dir`` and
    save them in the speculators format (``verifier``: its ``name_or_path`` and
    ``architectures``). Deterministic for fixed ``seed``, ``batches`` and thread count.
    Returns the final losses."""
    from runner.eagle import spec_for_target
    from runner.models import load_causal_lm

    target = load_causal_lm(target_dir, "cpu")
    for p in target.parameters():
        p.requires_grad_(False)
    losses: dict[str, float] = {}
    jobs = [(1, eagle_dir), (3, eagle3_dir)]
    for version, out in jobs:
        if out is None:
            continue
        name = "eagle" if version == 1 else "eagle3"
        torch.manual_seed(seed + version)
        ids = None
        size = None
        if version == 3:
            size = draft_vocab_size or int(target.config.vocab_size)
            ids = draft_vocabulary(target, batches, size)
        spec = spec_for_target(target.config, version, draft_vocab_size=size, aux_layers=aux_layers)
        head = new_head(spec, target, ids)

        def step_tick(stage: str = name) -> None:
            if tick is not None:
                tick(stage)

        losses[name] = train_head(
            head, target, batches, steps, lr=lr, ttt_steps=ttt_steps, tick=step_tick
        )
        head.save(out, verifier, k)
    return losses
