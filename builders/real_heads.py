"""EAGLE-1 and EAGLE-3 reference heads for the real pair's target-v1: a second cached stage.

The model build (:mod:`builders.real`, its ``RECIPE`` and ``BUILD_COMPLETE.json``) is left
alone; this stage reads ``target-v1`` from a finished build and writes ``eagle/`` and
``eagle3/`` (speculators format, the tokenizer beside them) plus its own marker
``HEADS_COMPLETE.json`` naming :data:`HEADS_RECIPE`'s digest and the model build's, so a
changed model build or heads recipe rebuilds the heads and nothing else.

Training data: target-v1's own greedy answers to the distillation prompts, rendered with
its chat template (and the same prompts as raw text), exactly the ``answers`` set of the
model build (``builders.real._greedy_answers``; the stage checks the token ids against the
build manifest's SHA-256). EAGLE and speculators train heads on target-generated text: a
head learns to predict what the target emits when served, not what a corpus contains.

CPU budget: the target runs once per training sequence (features cached: post-norm last
hidden state for EAGLE-1, the residual-stream inputs of layers ``aux_layers`` for EAGLE-3,
the teacher's top ids); a training step only runs the one-layer head. EAGLE-1's soft
cross-entropy is over a candidate set (the sequences' labels and teacher top ids plus a
fixed random sample of the vocabulary), as in the model build's distillation; EAGLE-3's
is over its whole reduced draft vocabulary (its own LM head). Training-time test as in
:mod:`builders.eagle_train` (same mask, step weights and losses).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from builders import real
from builders.stage import Laps, ProgressFn, Stage, Ticker, recipe_digest

HEADS_MARKER = real.HEADS_MARKER
HEADS_RECIPE: dict[str, Any] = {
    "version": "real-heads-1",
    "seed": 20251202,
    "threads": 1,
    "data": "target-v1 greedy answers (the model build's answers set)",
    "steps": 256,
    "batch": 2,
    "lr": 3e-3,
    "ttt_steps": 3,
    "ce_weight": 0.1,
    "negatives": 1024,
    "teacher_topk": 16,
    "draft_vocab_size": 8192,
    # vLLM's default (2, L // 2, L - 3) for L = 30
    "aux_layers": [2, 15, 27],
    "k": 4,
}
VERIFIER = {"name_or_path": "real/target-v1", "architectures": ["LlamaForCausalLM"]}
# heads of another target-v1 are other heads: the model build's digest is in the recipe
HEADS = Stage(
    "real-heads",
    {"heads": HEADS_RECIPE, "models": real.MODELS.digest},
    HEADS_MARKER,
    outputs=("eagle/config.json", "eagle3/config.json"),
)


@dataclass(frozen=True)
class RealHeadsPaths:
    root: str
    target_v1: str
    eagle: str
    eagle3: str
    marker: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def real_heads_paths(real_dir: str | os.PathLike[str] | None = None) -> RealHeadsPaths:
    p = real.real_paths(real_dir)
    root = Path(p.root)
    return RealHeadsPaths(
        root=p.root,
        target_v1=p.target_v1,
        eagle=str(root / "eagle"),
        eagle3=str(root / "eagle3"),
        marker=str(root / HEADS_MARKER),
    )


def heads_recipe_digest() -> str:
    return recipe_digest(HEADS_RECIPE)


def heads_built(real_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when the heads of the current heads recipe exist for the current model build."""
    root = real_heads_paths(real_dir).root
    return HEADS.is_built(root) and real.is_built(root)


def total_ticks() -> int:
    return real.answer_batches() + 1 + 2 * HEADS_RECIPE["steps"]


def build_real_heads(
    real_dir: str | os.PathLike[str] | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
) -> RealHeadsPaths:
    """Train (or reuse) the EAGLE-1 and EAGLE-3 heads for target-v1 of the real build in
    ``real_dir`` (which must be built); ``progress(stage, done, total)``."""
    paths = real_heads_paths(real_dir)
    if not force and heads_built(paths.root):
        return paths
    if not real.is_built(paths.root):
        raise RuntimeError(
            f"no complete real-pair build in {paths.root}: run the model build first"
        )
    tick = Ticker(progress, total_ticks())
    HEADS.run(
        paths.root, lambda _: _build(paths, tick), threads=HEADS_RECIPE["threads"], force=force
    )
    return paths


# --------------------------------------------------------------------------- data


@dataclass
class _Seq:
    ids: torch.Tensor  # [T]
    final: torch.Tensor  # [T, H] post-norm last hidden state
    aux: torch.Tensor  # [T, 3H] inputs of the aux layers
    topk: torch.Tensor  # [T, K] teacher's top ids


@torch.no_grad()
def _features(target, seqs: list[list[int]], aux_layers: list[int], topk: int) -> list[_Seq]:
    head_w = target.lm_head.weight
    out = []
    for ids in seqs:
        t = torch.tensor([ids])
        res = target.model(input_ids=t, output_hidden_states=True)
        final = res.last_hidden_state[0]
        aux = torch.cat([res.hidden_states[i][0] for i in aux_layers], dim=-1)
        out.append(_Seq(t[0], final, aux, (final @ head_w.T).topk(topk, dim=-1).indices))
    return out


def draft_vocabulary(tok, answers: list[list[int]], size: int) -> list[int]:
    """EAGLE-3's reduced vocabulary, ascending: every id of the target's greedy answers
    (most frequent first), then the most frequent ids of stdlib prose and source as the
    target tokenizer splits them, ties broken by id (deterministic)."""
    from builders import real_data

    seen = Counter(i for seq in answers for i in seq)
    text = Counter(tok(real_data.stdlib_prose())["input_ids"])
    text.update(tok(real_data.stdlib_code())["input_ids"])
    vocab = int(len(tok))
    order = sorted(range(vocab), key=lambda i: (-seen.get(i, 0), -text.get(i, 0), i))
    return sorted(order[:size])


# --------------------------------------------------------------------------- training


def _train(head, target, seqs: list[_Seq], negatives, gen, tick: Callable[[], None]) -> float:
    from transformers import DynamicCache

    from builders.eagle_train import STEP_WEIGHT, _lr, _ttt_mask

    _batches = real._batches

    r = HEADS_RECIPE
    version = head.spec.version
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=r["lr"], weight_decay=0.0)
    head_w = target.lm_head.weight.detach()
    embed = target.get_input_embeddings()
    draft_w = head_w[head.draft_ids] if version == 3 else None
    head.train()
    last = float("nan")
    for step, batch in enumerate(_batches(len(seqs), r["batch"], r["steps"], gen)):
        for g in opt.param_groups:
            g["lr"] = _lr(step, r["steps"], r["lr"])
        chosen = [seqs[i] for i in batch]
        if version == 1:
            cand = torch.unique(
                torch.cat(
                    [negatives, *[s.topk.reshape(-1) for s in chosen], *[s.ids for s in chosen]]
                )
            )
            w = head_w[cand]
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for s in chosen:
            n = s.ids.numel() - 1
            feats = s.final if version == 1 else s.aux
            hidden = head.fuse(feats[None, :-1])
            with torch.no_grad():
                teacher = s.final[1:] @ (w if version == 1 else draft_w).T  # [n, C]
                t_prob = torch.softmax(teacher, -1)
            cache = DynamicCache()
            loss = torch.zeros(())
            for k in range(r["ttt_steps"]):
                valid = n - k
                if valid <= 0:
                    break
                ids = torch.zeros(1, n, dtype=torch.long)
                ids[0, :valid] = s.ids[1 + k :]
                pos = (torch.arange(n) + k)[None]
                mask = _ttt_mask(n, k, hidden.dtype)
                if version == 1:
                    out, _ = _eagle1_forward(head, ids, hidden, pos, mask, cache)
                    o = out[0, :valid]
                    reg = F.smooth_l1_loss(o, s.final[1 + k :])
                    ce = -(t_prob[k:] * torch.log_softmax(o @ w.T, -1)).sum(-1).mean()
                    step_loss = reg + r["ce_weight"] * ce
                else:
                    e = embed(ids)
                    pe = head.rotary_emb(hidden, position_ids=pos)
                    out = head.layers[0](e, hidden, mask, pe, cache)
                    lg = head.lm_head(head.norm(out[0, :valid]))
                    step_loss = -(t_prob[k:] * torch.log_softmax(lg, -1)).sum(-1).mean()
                loss = loss + (STEP_WEIGHT**k) * step_loss
                hidden = out
            loss = loss / len(chosen)
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        last = total
        tick()
    head.eval()
    return last


def _eagle1_forward(head, ids, hidden, pos, mask, cache):
    """EAGLE-1's forward without the full-vocabulary LM head (the loss uses candidates)."""
    embed, _ = head._shared
    e = embed(ids).to(hidden.dtype)
    pe = head.rotary_emb(hidden, position_ids=pos)
    x = head.fc(torch.cat([e, hidden], dim=-1))
    out = head.layers[0](
        x, attention_mask=mask, position_embeddings=pe, position_ids=pos, cache=cache,
        use_cache=True,
    )  # fmt: skip
    return out, None


# --------------------------------------------------------------------------- build


def _build(paths: RealHeadsPaths, tick: Ticker) -> dict[str, Any]:
    """The heads stage; returns what its completion marker records."""
    from builders import real_data
    from builders.eagle_train import new_head
    from registry.artifacts.manifest import build_manifest
    from runner.eagle import spec_for_target
    from runner.models import load_causal_lm, load_tokenizer

    r = HEADS_RECIPE
    lap = Laps()
    losses: dict[str, float] = {}
    tok = load_tokenizer(paths.target_v1)
    target = load_causal_lm(paths.target_v1, "cpu")
    for p in target.parameters():
        p.requires_grad_(False)
    answers = real._greedy_answers(target, tok, tick, "answers")
    answers_sha = real_data.digest_sequences(answers)
    built = real.read_build_manifest(paths.root)["data"]["answers"]["sha256"]
    lap("answers")
    seqs = _features(target, answers, r["aux_layers"], r["teacher_topk"])
    draft_ids = draft_vocabulary(tok, answers, r["draft_vocab_size"])
    tick("features")
    lap("features")
    gen = torch.Generator().manual_seed(r["seed"])
    negatives = torch.randperm(int(target.config.vocab_size), generator=gen)[: r["negatives"]]
    for version, out in ((1, paths.eagle), (3, paths.eagle3)):
        name = "eagle" if version == 1 else "eagle3"
        torch.manual_seed(r["seed"] + version)
        spec = spec_for_target(
            target.config, version,
            draft_vocab_size=r["draft_vocab_size"] if version == 3 else None,
            aux_layers=r["aux_layers"] if version == 3 else None,
        )  # fmt: skip
        head = new_head(spec, target, draft_ids if version == 3 else None)
        losses[name] = _train(head, target, seqs, negatives, gen, lambda n=name: tick(n))
        head.save(out, VERIFIER, r["k"])
        tok.save_pretrained(out)
        lap(name)
    return {
        "heads_recipe": HEADS_RECIPE,
        "heads_recipe_digest": heads_recipe_digest(),
        "model_recipe_digest": real.recipe_digest(),
        "trained_against": build_manifest(paths.target_v1).digest,
        "data": {
            "sequences": len(answers),
            "tokens": sum(map(len, answers)),
            "sha256": answers_sha,
            "same_as_build_answers": answers_sha == built,
        },
        "final_losses": {k: round(v, 4) for k, v in losses.items()},
        "manifest_digests": {
            "eagle": build_manifest(paths.eagle).digest,
            "eagle3": build_manifest(paths.eagle3).digest,
        },
        "stage_wall_seconds": lap.seconds,
    }
