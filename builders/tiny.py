"""Deterministic tiny reference pairs, built locally in about a minute on two CPU cores.

They exist so the whole project (engine, statistics, drift detection, governance) can be
exercised end to end without downloading anything. The recipe is fixed (seeds, step
counts, data selection, thread count), so two builds in the same environment give the
same weights. Each of the two stages below is cached per recipe digest
(:mod:`builders.stage`): by default in ``<cache>/tiny/<digest>``; a complete build is reused.

Models (all share one byte-level tokenizer, vocabulary 256 bytes + ``<pad> <bos> <eos>``):

* ``target-v1``: Llama, 4 layers, hidden 256, trained on Python standard-library source.
* ``draft``: Llama, 1 layer, hidden 128, same data; its config names its intended target.
* ``medusa``: 3 Medusa heads trained on target-v1's hidden states.
* ``target-v2``: target-v1 fine-tuned on prose from ``pydoc_data.topics``; the draft was
  never trained against it, so its acceptance on code drops (the drift scenario).
* ``eagle`` / ``eagle3``: EAGLE-1 and EAGLE-3 heads for target-v1 in the speculators format
  (EAGLE-3 reads target layers 1, 2, 3 and drafts over the 96 tokens target-v1 predicts
  most), and ``medusa-tree.json``: a static Medusa tree from the heads' measured rank
  accuracies. They are a second stage with their own marker, so an existing build of the
  models above is kept and only the heads are added.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from builders.settings import cache_root
from builders.stage import ProgressFn, Stage, Ticker

RECIPE_VERSION = "tiny-1"
MARKER = "BUILD_COMPLETE.json"
SEQ_LEN = 128
BATCH = 16
PAD_ID, BOS_ID, EOS_ID = 256, 257, 258
VOCAB_SIZE = 259
TARGET_STEPS = 180
DRAFT_STEPS = 300
MEDUSA_STEPS = 100
V2_STEPS = 60
MEDUSA_HEADS = 3
HEADS_RECIPE_VERSION = "tiny-heads-1"
HEADS_MARKER = "HEADS_COMPLETE.json"
HEADS_STEPS = 100
HEADS_BATCH = 8
EAGLE3_DRAFT_VOCAB = 96
EAGLE3_LAYERS = [1, 2, 3]
MEDUSA_TREE_NODES = 14

# Everything that decides the weights (the seeds and learning rates sit in the build code
# and are covered by the version): changing any of it gives another digest, so another
# cache directory.
RECIPE: dict[str, Any] = {
    "version": RECIPE_VERSION,
    "threads": 2,
    "seq_len": SEQ_LEN,
    "batch": BATCH,
    "vocab_size": VOCAB_SIZE,
    "target_steps": TARGET_STEPS,
    "draft_steps": DRAFT_STEPS,
    "medusa_steps": MEDUSA_STEPS,
    "v2_steps": V2_STEPS,
    "medusa_heads": MEDUSA_HEADS,
}
MODELS = Stage(
    "tiny-models",
    RECIPE,
    MARKER,
    outputs=("tokenizer", "target-v1", "target-v2", "draft", "medusa"),
    dependents=(HEADS_MARKER,),
)
HEADS_RECIPE: dict[str, Any] = {
    "version": HEADS_RECIPE_VERSION,
    "threads": 1,
    "steps": HEADS_STEPS,
    "batch": HEADS_BATCH,
    "eagle3_draft_vocab": EAGLE3_DRAFT_VOCAB,
    "eagle3_layers": EAGLE3_LAYERS,
    "medusa_tree_nodes": MEDUSA_TREE_NODES,
    "models": MODELS.digest,  # heads of another target-v1 are other heads
}
HEADS = Stage(
    "tiny-heads", HEADS_RECIPE, HEADS_MARKER, outputs=("eagle", "eagle3", "medusa-tree.json")
)


@dataclass(frozen=True)
class TinyPaths:
    """Paths of one tiny build (all plain strings so they serialise anywhere)."""

    root: str
    tokenizer: str
    target_v1: str
    target_v2: str
    draft: str
    medusa: str
    eagle: str
    eagle3: str
    medusa_tree: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def default_tiny_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """``<cache root>/tiny/<recipe key>`` (:mod:`builders.settings`; ``root`` overrides)."""
    return cache_root(root) / "tiny" / MODELS.key


def tiny_paths(out_dir: str | os.PathLike[str] | None = None) -> TinyPaths:
    """Where the parts of a build in ``out_dir`` live (whether or not it exists yet)."""
    root = Path(out_dir) if out_dir is not None else default_tiny_dir()
    return TinyPaths(
        root=str(root),
        tokenizer=str(root / "tokenizer"),
        target_v1=str(root / "target-v1"),
        target_v2=str(root / "target-v2"),
        draft=str(root / "draft"),
        medusa=str(root / "medusa"),
        eagle=str(root / "eagle"),
        eagle3=str(root / "eagle3"),
        medusa_tree=str(root / "medusa-tree.json"),
    )


def is_built(out_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when ``out_dir`` holds a complete build of the current recipe (heads included)."""
    root = tiny_paths(out_dir).root
    return MODELS.is_built(root) and HEADS.is_built(root)


# --------------------------------------------------------------------------- tokenizer


def make_tokenizer():  # -> PreTrainedTokenizerFast
    """A real fast tokenizer where byte ``b`` is token id ``b``; BOS is prepended on encode."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    vocab.update({"<pad>": PAD_ID, "<bos>": BOS_ID, "<eos>": EOS_ID})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    fast.add_special_tokens({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"})
    return fast


# --------------------------------------------------------------------------- data


def code_corpus(max_bytes: int = 1_500_000) -> bytes:
    """Python stdlib source: top-level modules in sorted order until ``max_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def prose_corpus() -> bytes:
    """Prose from the language reference bundled with pydoc (``pydoc_data.topics``)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


class _Sampler:
    """Random windows starting at line starts, each prefixed by BOS like a prompt."""

    def __init__(self, data: bytes, seed: int) -> None:
        self.data = torch.tensor(list(data), dtype=torch.long)
        starts = [0] + [i + 1 for i, b in enumerate(data[: -SEQ_LEN - 2]) if b == 10]
        self.starts = torch.tensor(starts, dtype=torch.long)
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self) -> torch.Tensor:
        idx = torch.randint(len(self.starts), (BATCH,), generator=self.gen)
        s = self.starts[idx]
        offs = torch.arange(SEQ_LEN - 1)
        body = self.data[s[:, None] + offs[None, :]]
        bos = torch.full((BATCH, 1), BOS_ID, dtype=torch.long)
        return torch.cat([bos, body], dim=1)


# --------------------------------------------------------------------------- models


def _llama_config(hidden: int, layers: int, heads: int, intermediate: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    )


def _lr(step: int, steps: int, peak: float, warmup: int = 20) -> float:
    import math

    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _train_lm(
    model, sampler: _Sampler, steps: int, peak_lr: float, stage: str, tick: Callable[[str], None]
) -> float:
    """Plain next-token training; returns the last loss (for the build log)."""
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.01)
    model.train()
    loss_val = float("nan")
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, peak_lr)
        batch = sampler.batch()
        out = model(input_ids=batch, labels=batch, use_cache=False)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = float(out.loss.detach())
        tick(stage)
    model.eval()
    return loss_val


def _train_medusa(
    target, heads, sampler: _Sampler, steps: int, tick: Callable[[str], None]
) -> float:
    """Heads learn target-v1's own greedy-ish future from its frozen hidden states."""
    opt = torch.optim.AdamW(heads.parameters(), lr=3e-3, weight_decay=0.0)
    heads.train()
    loss_val = float("nan")
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, 3e-3, warmup=10)
        batch = sampler.batch()
        with torch.no_grad():
            hidden = target.model(input_ids=batch, use_cache=False).last_hidden_state
        logits = heads(hidden)  # [H, B, T, V]
        loss = torch.zeros(())
        for i in range(heads.num_heads):
            shift = i + 2
            pred = logits[i, :, :-shift].reshape(-1, logits.shape[-1])
            gold = batch[:, shift:].reshape(-1)
            loss = loss + torch.nn.functional.cross_entropy(pred, gold)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_val = loss.detach().item() / heads.num_heads
        tick("medusa")
    heads.eval()
    return loss_val


def build_tiny_pairs(
    out_dir: str | os.PathLike[str] | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
) -> TinyPaths:
    """Build (or reuse) the tiny pairs under ``out_dir`` (default: the cache directory of
    this recipe) and return their paths.

    ``progress(stage, done, total)`` is called after each training step so a CLI can
    draw a bar. The models stage runs on 2 threads, the heads stage on 1, with
    deterministic algorithms, so the result does not depend on the machine's core count.
    """
    paths = tiny_paths(out_dir)
    models = force or not MODELS.is_built(paths.root)
    heads = 2 * HEADS_STEPS
    tick = Ticker(
        progress, heads + (TARGET_STEPS + DRAFT_STEPS + MEDUSA_STEPS + V2_STEPS if models else 0)
    )
    # a models build removes the heads marker (MODELS.dependents): heads trained on a
    # replaced target-v1 are rebuilt, once, by whichever builder takes the heads lock first
    MODELS.run(paths.root, lambda _: _build(paths, tick), threads=RECIPE["threads"], force=force)
    HEADS.run(
        paths.root, lambda _: _build_heads(paths, tick), threads=HEADS_RECIPE["threads"],
        force=force,
    )  # fmt: skip
    return paths


def _build(paths: TinyPaths, tick: Callable[[str], None]) -> Mapping[str, Any]:
    """target-v1, the draft, the Medusa heads and target-v2 (the models stage)."""
    from transformers import LlamaForCausalLM

    from runner.medusa import MedusaHeads

    losses: dict[str, float] = {}
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(paths.tokenizer)
    code = code_corpus()

    torch.manual_seed(1234)
    target = LlamaForCausalLM(_llama_config(256, 4, 4, 512))
    losses["target-v1"] = _train_lm(
        target, _Sampler(code, 1), TARGET_STEPS, 3e-3, "target-v1", tick
    )
    target.generation_config.pad_token_id = PAD_ID
    target.save_pretrained(paths.target_v1)
    tokenizer.save_pretrained(paths.target_v1)

    torch.manual_seed(2345)
    draft = LlamaForCausalLM(_llama_config(128, 1, 2, 256))
    losses["draft"] = _train_lm(draft, _Sampler(code, 2), DRAFT_STEPS, 4e-3, "draft", tick)
    draft.config.speculators_config = {
        "algorithm": "draft_model",
        "verifier": {"name_or_path": "tiny/target-v1", "architectures": ["LlamaForCausalLM"]},
    }
    draft.generation_config.pad_token_id = PAD_ID
    draft.save_pretrained(paths.draft)
    tokenizer.save_pretrained(paths.draft)

    torch.manual_seed(3456)
    heads = MedusaHeads(256, VOCAB_SIZE, MEDUSA_HEADS, 1)
    with torch.no_grad():  # start every head from the target's LM head, as Medusa does
        for head in heads.heads:
            head[-1].weight.copy_(target.lm_head.weight)
    losses["medusa"] = _train_medusa(target, heads, _Sampler(code, 3), MEDUSA_STEPS, tick)
    heads.save(paths.medusa, base_model="tiny/target-v1")
    tokenizer.save_pretrained(paths.medusa)

    torch.manual_seed(4567)
    losses["target-v2"] = _train_lm(
        target, _Sampler(prose_corpus(), 4), V2_STEPS, 2e-3, "target-v2", tick
    )
    target.save_pretrained(paths.target_v2)
    tokenizer.save_pretrained(paths.target_v2)
    return {"final_losses": {k: round(v, 4) for k, v in losses.items()}}


def _build_heads(paths: TinyPaths, tick: Callable[[str], None]) -> Mapping[str, Any]:
    """EAGLE-1 and EAGLE-3 heads for target-v1 (speculators format) and a Medusa tree."""
    from builders.eagle_train import (
        medusa_rank_accuracy,
        medusa_tree_choices,
        train_reference_heads,
    )
    from runner.medusa import load_medusa
    from runner.models import load_causal_lm

    # one thread (HEADS_RECIPE): small models train no slower on one, and results do not
    # depend on how many cores the machine has or how busy they are
    sampler = _Sampler(code_corpus(), 5)

    def batches() -> torch.Tensor:
        return sampler.batch()[:HEADS_BATCH]

    verifier = {"name_or_path": "tiny/target-v1", "architectures": ["LlamaForCausalLM"]}
    losses = train_reference_heads(
        paths.target_v1,
        batches,
        eagle_dir=paths.eagle,
        eagle3_dir=paths.eagle3,
        steps=HEADS_STEPS,
        verifier=verifier,
        k=4,
        draft_vocab_size=EAGLE3_DRAFT_VOCAB,
        aux_layers=EAGLE3_LAYERS,
        seed=5678,
        tick=tick,
    )
    target = load_causal_lm(paths.target_v1, "cpu")
    heads = load_medusa(paths.medusa)
    calib = _Sampler(code_corpus(), 6)
    accuracy = medusa_rank_accuracy(target, heads, calib.batch, n_batches=2, max_rank=4)
    choices = medusa_tree_choices(accuracy, MEDUSA_TREE_NODES)
    tree = {"kind": "static", "choices": choices, "accuracy": accuracy}
    Path(paths.medusa_tree).write_text(json.dumps(tree, indent=2) + "\n")
    for d in (paths.eagle, paths.eagle3):
        make_tokenizer().save_pretrained(d)
    return {"final_losses": {k: round(v, 4) for k, v in losses.items()}}


def medusa_tree(paths: TinyPaths) -> dict[str, Any]:
    """The tiny build's Medusa tree as a pair config ``tree`` value."""
    data = json.loads(Path(paths.medusa_tree).read_text())
    return {"kind": "static", "choices": data["choices"]}
