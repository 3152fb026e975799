"""Benchmark: pairreg's speculative engine vs transformers assisted generation vs plain
``generate()`` on the tiny pair, greedy, same prompts, one process.

Usage: ``python bench/runner_bench.py [--k 4] [--max-new-tokens 64] [--prompts 8]``.
Outputs of all three must match token for token (fp32 greedy); the script exits non-zero
otherwise. Target: pairreg >= 1.2x the tokens/s of transformers' assisted generation.

``--trees``: token tree vs chain for the same heads (Medusa with the tiny build's tree,
EAGLE-1 and EAGLE-3 with an EAGLE-2 dynamic tree, by default of the size EAGLE-2's reference
code ships: top_k 10, 60 nodes, at the chain's depth), greedy and at temperature 1, same
prompts and seeds: tau (from the counters), tokens/s and verified nodes per step. Greedy
outputs must equal plain greedy. Target: the tree raises tau by >= 20% over the chain for
the same heads at temperature 1 (greedy tau on the tiny target is near its ceiling: its
greedy continuations settle into repetitive code that every drafter predicts).

``--real`` / ``--real-alpha``: the real reference pair (SmolLM2-135M-Instruct and its
self-speculative draft, ``pairreg real build``); see ``bench/real_pair.py``. Use
``--threads 2 --prompts 4 --max-new-tokens 48`` there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import real_pair  # noqa: E402
from builders.tiny import build_tiny_pairs, medusa_tree  # noqa: E402
from runner.build import build_drafter  # noqa: E402
from runner.drafters import DraftModelDrafter  # noqa: E402
from runner.engine import DecodeOptions, SpeculativeEngine  # noqa: E402
from runner.measure import encode_prompt  # noqa: E402
from runner.models import eos_ids, load_causal_lm, load_tokenizer  # noqa: E402
from runner.settings import MeasureSettings  # noqa: E402
from runner.stats import summarize_group  # noqa: E402
from runner.suites import load_suite  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--suite", default="code")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes (best is reported)")
    ap.add_argument("--tiny-dir", default=None)
    ap.add_argument("--trees", action="store_true", help="tree vs chain for the same heads")
    ap.add_argument("--top-k", type=int, default=10, help="EAGLE-2 tree: top-k (--trees)")
    ap.add_argument("--total-tokens", type=int, default=60, help="EAGLE-2 tree: nodes")
    real_pair.add_arguments(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.trees:
        return tree_bench(args)
    if args.real:
        return real_pair.speed(args)
    if args.real_alpha:
        return real_pair.alpha(args)
    if args.real_heads:
        from bench import real_heads

        return real_heads.heads(args)

    paths = build_tiny_pairs(args.tiny_dir)
    tok = load_tokenizer(paths.target_v1)
    target = load_causal_lm(paths.target_v1, "cpu")
    draft = load_causal_lm(paths.draft, "cpu")
    eos = eos_ids(target, tok)
    prompts = [encode_prompt(tok, p.prompt) for p in load_suite(args.suite).prompts]
    prompts = prompts[: args.prompts]
    k, n_new = args.k, args.max_new_tokens

    # transformers reads the assistant's knobs from the assistant's generation config;
    # threshold 0 disables the confidence-based early stop (None would mean 0.4)
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    gen_kwargs = dict(do_sample=False, max_new_tokens=n_new, pad_token_id=tok.pad_token_id)

    engine = SpeculativeEngine(
        target, DraftModelDrafter(draft, None), DecodeOptions(k=k, max_new_tokens=n_new), eos
    )

    def run_pairreg() -> list[list[int]]:
        return [engine.generate(p).output_ids for p in prompts]

    def run_hf(assisted: bool) -> list[list[int]]:
        outs = []
        with torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p])
                kw = dict(gen_kwargs)
                if assisted:
                    kw.update(
                        assistant_model=draft,
                        num_assistant_tokens=k,
                        num_assistant_tokens_schedule="constant",
                        assistant_confidence_threshold=0.0,
                    )
                seq = target.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                outs.append(seq[0, len(p) :].tolist())
        return outs

    runners = {
        "pairreg": run_pairreg,
        "hf_assisted": lambda: run_hf(True),
        "hf_plain": lambda: run_hf(False),
    }
    for fn in runners.values():  # warm-up (allocators, lazy init)
        fn()
    results: dict[str, tuple[float, list[list[int]]]] = {}
    for name, fn in runners.items():
        best = float("inf")
        outs: list[list[int]] = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            outs = fn()
            best = min(best, time.perf_counter() - t0)
        results[name] = (best, outs)

    ref = results["hf_plain"][1]
    ok = True
    for name, (_, outs) in results.items():
        if outs != ref:
            ok = False
            bad = sum(a != b for a, b in zip(outs, ref, strict=True))
            print(f"MISMATCH: {name} differs from plain generate() on {bad} prompts")
    n_tokens = sum(len(o) for o in ref)
    print(
        f"prompts={len(prompts)} k={k} max_new_tokens={n_new} threads={args.threads} "
        f"tokens={n_tokens}"
    )
    tps = {name: n_tokens / t for name, (t, _) in results.items()}
    for name, v in tps.items():
        print(f"{name:12s} {v:9.1f} tok/s  ({results[name][0]:.3f} s)")
    ratio = tps["pairreg"] / tps["hf_assisted"]
    print(f"pairreg / hf_assisted = {ratio:.2f}x")
    print(f"pairreg / hf_plain    = {tps['pairreg'] / tps['hf_plain']:.2f}x")
    print(f"hf_assisted / hf_plain = {tps['hf_assisted'] / tps['hf_plain']:.2f}x")
    print("outputs match" if ok else "OUTPUTS DIFFER")
    if not ok:
        return 1
    if ratio < 1.2:
        print("below target: pairreg should be >= 1.2x transformers assisted generation")
        return 2
    return 0


def tree_bench(args: argparse.Namespace) -> int:
    paths = build_tiny_pairs(args.tiny_dir)
    tok = load_tokenizer(paths.target_v1)
    target = load_causal_lm(paths.target_v1, "cpu")
    eos = eos_ids(target, tok)
    suite = load_suite(args.suite).prompts[: args.prompts]
    prompts = [encode_prompt(tok, p.prompt) for p in suite]
    n_new = args.max_new_tokens
    mtree = medusa_tree(paths)
    m_depth = max(len(c) for c in mtree["choices"])
    dyn = {"kind": "dynamic", "top_k": args.top_k, "total_tokens": args.total_tokens}
    heads = [
        ("medusa", paths.medusa, m_depth, mtree),
        ("eagle", paths.eagle, args.k, dyn),
        ("eagle3", paths.eagle3, args.k, dyn),
    ]
    refs = [plain_greedy(target, p, n_new, eos) for p in prompts]
    gen = torch.Generator()
    print(f"prompts={len(prompts)} max_new_tokens={n_new} threads={args.threads} "
          f"eagle2 tree: top_k={args.top_k} total_tokens={args.total_tokens}")  # fmt: skip
    print(f"{'heads':8s} {'T':>3s} {'shape':6s} {'k':>2s} {'tau':>6s} {'alpha':>6s} "
          f"{'nodes/step':>10s} {'tok/s':>8s}")  # fmt: skip
    failed = []
    for method, ddir, k, tree in heads:
        for temp in (0.0, 1.0):
            taus = {}
            for shape, tr in (("chain", None), ("tree", tree)):
                s = MeasureSettings(method=method, k=k, temperature=temp, tree=tr,
                                    max_new_tokens=n_new, device="cpu")  # fmt: skip
                drafter, k_eff = build_drafter(s, ddir, target, torch.device("cpu"), gen)
                opts = DecodeOptions(k=k_eff, max_new_tokens=n_new, temperature=temp)
                engine = SpeculativeEngine(target, drafter, opts, eos, gen)
                best, runs = float("inf"), []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    runs = []
                    for i, p in enumerate(prompts):
                        gen.manual_seed(1000 + i)
                        runs.append(engine.generate(p))
                    best = min(best, time.perf_counter() - t0)
                if temp == 0 and [r.output_ids for r in runs] != refs:
                    print(f"MISMATCH: {method} {shape} differs from plain greedy")
                    return 1
                g = summarize_group([r.to_dict() for r in runs], k_eff, n_boot=10)
                taus[shape] = g["tau"]
                tokens = sum(r.emitted for r in runs)
                print(f"{method:8s} {temp:3.0f} {shape:6s} {k_eff:2d} {g['tau']:6.2f} "
                      f"{g['alpha']:6.3f} {g['draft_tokens_per_step']:10.1f} "
                      f"{tokens / best:8.1f}")  # fmt: skip
            gain = taus["tree"] / taus["chain"]
            print(f"{'':8s} tree / chain tau = {gain:.2f}x")
            if temp > 0 and gain < 1.2:
                failed.append(f"{method} at T={temp:g}: {gain:.2f}x")
    if failed:
        print("below target (tree tau >= 1.2x chain): " + "; ".join(failed))
        return 2
    return 0


def plain_greedy(target, prompt: list[int], n: int, eos: set[int]) -> list[int]:
    from runner.engine import greedy_decode

    return greedy_decode(target, prompt, n, eos)


if __name__ == "__main__":
    raise SystemExit(main())
