"""The real reference pair in the runner benchmark (``runner_bench.py --real``, ``--real-alpha``).

``--real``: pairreg's engine vs transformers assisted generation (``assistant_model``,
constant ``k``, no confidence stop) vs plain ``generate()`` with target-v1 and its draft on
the same chat prompts, greedy; outputs must be identical. Prints tokens/s, the ratios and
the share of pairreg's wall time spent outside the model forward passes (loop overhead).
Targets on two CPU cores: >= 1.3x assisted generation, overhead <= 10%.

It also times transformers' own forward passes during its assisted run (hooks on both
models' ``forward``) and counts the passes of both engines, so it prints how much of the
assisted run is *not* model forward passes, and the bound that follows: an engine that
runs the same passes cannot beat assisted generation by more than the assisted run's wall
time over pairreg's own time inside the forward passes (its loop overhead taken to zero).

``--real-alpha``: greedy α per category for target-v1/draft, target-v2/draft and
target-v2/draft-v2 (chat-rendered prompts from the built-in suites; ``--raw``: the prompts
encoded as the validator encodes them, raw text after BOS), with the build's wall and CPU
time.

``--real-heads``: the EAGLE heads against the draft (``bench/real_heads.py``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from builders.real import MARKER, build_real_pair
from runner.drafters import DraftModelDrafter
from runner.engine import DecodeOptions, SpeculativeEngine
from runner.measure import encode_prompt
from runner.models import eos_ids, load_causal_lm, load_tokenizer
from runner.stats import summarize_group
from runner.suites import load_suite


def chat_ids(tok, text: str) -> list[int]:
    """A suite prompt as a one-turn chat, rendered with the target's own template."""
    msgs = [{"role": "user", "content": text}]
    return list(
        tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    )


def _prompts(tok, suites: list[str], n: int, raw: bool = False) -> list[tuple[str, list[int]]]:
    out = []
    for name in suites:
        for p in load_suite(name).prompts[:n]:
            if p.is_chat:  # a chat suite (``chat:<category>``): its own messages
                out.append((p.category, encode_prompt(tok, p)))
            else:
                ids = encode_prompt(tok, p.prompt) if raw else chat_ids(tok, p.prompt)
                out.append((p.category, ids))
    return out


def speed(args: argparse.Namespace) -> int:
    paths = build_real_pair(args.real_dir)
    tok = load_tokenizer(paths.target_v1)
    target = load_causal_lm(paths.target_v1, "cpu")
    draft = load_causal_lm(paths.draft, "cpu")
    eos = eos_ids(target, tok)
    prompts = [ids for _, ids in _prompts(tok, args.suites.split(","), args.prompts)]
    k, n_new = args.k, args.max_new_tokens
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    engine = SpeculativeEngine(
        target, DraftModelDrafter(draft, None), DecodeOptions(k=k, max_new_tokens=n_new), eos
    )
    forward_s = [0.0]

    passes = {"target_calls": 0, "draft_steps": 0}

    def run_pairreg() -> list[list[int]]:
        outs = []
        forward_s[0] = 0.0
        for p in prompts:
            r = engine.generate(p)
            forward_s[0] += r.draft_time_s + r.target_time_s
            passes["target_calls"] += r.target_calls
            passes["draft_steps"] += r.drafted
            outs.append(r.output_ids)
        return outs

    hf_forward = {"target_s": 0.0, "draft_s": 0.0, "target_calls": 0, "draft_calls": 0}

    def timed(model: object, key: str) -> list[object]:
        started: list[float] = []

        def pre(*_: object) -> None:
            started.append(time.perf_counter())

        def post(*_: object) -> None:
            hf_forward[f"{key}_s"] += time.perf_counter() - started.pop()
            hf_forward[f"{key}_calls"] += 1

        return [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]  # type: ignore[attr-defined]

    def run_hf(assisted: bool) -> list[list[int]]:
        hooks = timed(target, "target") + timed(draft, "draft") if assisted else []
        outs = []
        kw: dict = dict(do_sample=False, max_new_tokens=n_new, pad_token_id=tok.pad_token_id,
                        eos_token_id=sorted(eos))  # fmt: skip
        if assisted:
            kw.update(assistant_model=draft, num_assistant_tokens=k,
                      num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)  # fmt: skip
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p])
                seq = target.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                out = seq[0, len(p) :].tolist()
                outs.append(out)
        for h in hooks:
            h.remove()  # type: ignore[attr-defined]
        return outs

    runners = {
        "pairreg": run_pairreg,
        "hf_assisted": lambda: run_hf(True),
        "hf_plain": lambda: run_hf(False),
    }
    results: dict[str, tuple[float, list[list[int]]]] = {}
    overhead = 0.0
    for name, fn in runners.items():
        t0 = time.perf_counter()
        outs = fn()
        wall = time.perf_counter() - t0
        results[name] = (wall, outs)
        if name == "pairreg":
            overhead = 1 - forward_s[0] / wall
    ref = results["hf_plain"][1]
    ok = all(outs == ref for _, outs in results.values())
    for name, (_, outs) in results.items():
        if outs != ref:
            bad = sum(a != b for a, b in zip(outs, ref, strict=True))
            print(f"MISMATCH: {name} differs from plain generate() on {bad} prompts")
    n_tokens = sum(len(o) for o in ref)
    print(f"real pair: prompts={len(prompts)} k={k} max_new_tokens={n_new} "
          f"threads={torch.get_num_threads()} tokens={n_tokens}")  # fmt: skip
    tps = {name: n_tokens / t for name, (t, _) in results.items()}
    for name, v in tps.items():
        print(f"{name:12s} {v:9.1f} tok/s  ({results[name][0]:.2f} s)")
    ratio = tps["pairreg"] / tps["hf_assisted"]
    print(f"pairreg / hf_assisted = {ratio:.2f}x")
    print(f"pairreg / hf_plain    = {tps['pairreg'] / tps['hf_plain']:.2f}x")
    print(f"hf_assisted / hf_plain = {tps['hf_assisted'] / tps['hf_plain']:.2f}x")
    print(f"pairreg loop overhead (wall outside forwards) = {100 * overhead:.1f}%")
    hf_wall = results["hf_assisted"][0]
    hf_in = hf_forward["target_s"] + hf_forward["draft_s"]
    print(
        f"forward passes: pairreg target {passes['target_calls']}, draft tokens "
        f"{passes['draft_steps']} ({forward_s[0]:.2f} s inside them); transformers target "
        f"{hf_forward['target_calls']}, draft {hf_forward['draft_calls']} ({hf_in:.2f} s)"
    )
    print(f"hf_assisted wall outside its forward passes = {100 * (1 - hf_in / hf_wall):.1f}%")
    print(
        f"bound for an engine running the same passes: hf_assisted wall / pairreg time in "
        f"forwards = {hf_wall / forward_s[0]:.2f}x"
    )
    print("outputs match" if ok else "OUTPUTS DIFFER")
    if not ok:
        return 1
    if ratio < 1.3 or overhead > 0.10:
        print("below target: >= 1.3x assisted generation and <= 10% loop overhead")
        return 2
    return 0


def alpha(args: argparse.Namespace) -> int:
    paths = build_real_pair(args.real_dir)
    meta = json.loads((Path(paths.root) / MARKER).read_text())
    print(f"build: wall {meta['wall_seconds']} s, CPU {meta['cpu_seconds']} s "
          f"(stages {meta['stage_wall_seconds']})")  # fmt: skip
    tok = load_tokenizer(paths.target_v1)
    prompts = _prompts(tok, args.suites.split(","), args.prompts, raw=args.raw)
    pairs = [
        ("v1/draft", paths.target_v1, paths.draft),
        ("v2/draft", paths.target_v2, paths.draft),
        ("v2/draft-v2", paths.target_v2, paths.draft_v2),
    ]
    cats = sorted({c for c, _ in prompts})
    print(f"greedy α, k={args.k}, max_new_tokens={args.max_new_tokens}, "
          f"{args.prompts} {'raw' if args.raw else 'chat'} prompts per category")  # fmt: skip
    print(f"{'pair':12s} " + " ".join(f"{c:>14s}" for c in cats) + f" {'overall':>14s}")
    loaded: dict[str, object] = {}
    for label, tdir, ddir in pairs:
        target = loaded.setdefault(tdir, load_causal_lm(tdir, "cpu"))
        draft = load_causal_lm(ddir, "cpu")
        engine = SpeculativeEngine(
            target, DraftModelDrafter(draft, None),
            DecodeOptions(k=args.k, max_new_tokens=args.max_new_tokens), eos_ids(target, tok),
        )  # fmt: skip
        rows = [{"category": c, **engine.generate(ids).to_dict()} for c, ids in prompts]
        cells = []
        for c in [*cats, None]:
            g = summarize_group([r for r in rows if c is None or r["category"] == c], args.k)
            cells.append(f"{g['alpha']:.3f} ±{(g['alpha_ci'][1] - g['alpha_ci'][0]) / 2:.3f}")
        print(f"{label:12s} " + " ".join(f"{x:>14s}" for x in cells))
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--real", action="store_true", help="real pair: engine vs transformers")
    ap.add_argument("--real-alpha", action="store_true", help="real pair: α per category")
    ap.add_argument(
        "--real-heads", action="store_true", help="real pair: EAGLE heads vs the draft (α, τ)"
    )
    ap.add_argument("--raw", action="store_true", help="--real-alpha: raw prompts (as validated)")
    ap.add_argument("--real-dir", default=None, help="real build dir (default: cache)")
    ap.add_argument("--suites", default="code,creative,summarization")
