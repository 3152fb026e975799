"""Acceptance by method on the tiny pair: the table in ``docs/runner.md``.

Usage: ``python bench/methods_table.py [--prompts 8] [--max-new-tokens 64] [--suite code]``.
Measures every drafter the tiny build has against target-v1 with ``runner.measure_pair``,
greedy and at temperature 1 (fixed seeds), and prints a Markdown table of alpha, tau and
per-depth acceptance (accepted at depth d / times depth d had candidates). Chains use
k = 4 (Medusa: its 3 heads); trees have the same depth as their chain.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from builders.tiny import build_tiny_pairs, medusa_tree  # noqa: E402
from runner import MeasureSettings, load_suite, measure_pair  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--suite", default="code")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tiny-dir", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    p = build_tiny_pairs(args.tiny_dir)
    mtree = medusa_tree(p)
    m_depth = max(len(c) for c in mtree["choices"])
    dyn = {"kind": "dynamic", "top_k": 3, "total_tokens": 12}
    k = args.k
    rows = [
        ("draft model", "draft_model", p.draft, k, None),
        ("prompt lookup", "prompt_lookup", None, k, None),
        ("Medusa chain", "medusa", p.medusa, 3, None),
        (f"Medusa tree ({len(mtree['choices'])} nodes)", "medusa", p.medusa, m_depth, mtree),
        ("EAGLE-1 chain", "eagle", p.eagle, k, None),
        ("EAGLE-3 chain", "eagle3", p.eagle3, k, None),
        ("EAGLE-2 tree, EAGLE-1 heads", "eagle", p.eagle, k, dyn),
        ("EAGLE-2 tree, EAGLE-3 heads", "eagle3", p.eagle3, k, dyn),
    ]
    prompts = load_suite(args.suite).prompts[: args.prompts]
    t0 = time.perf_counter()
    print(
        f"tiny pair, target-v1, suite {args.suite}: {len(prompts)} prompts x "
        f"{args.max_new_tokens} tokens; EAGLE-2 tree: top_k 3, 12 nodes\n"
    )
    print("| drafter | k | greedy α | greedy τ | greedy per depth | T=1 α | T=1 τ | "
          "T=1 per depth | nodes/step (T=1) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for label, method, ddir, depth, tree in rows:
        cells = []
        nodes = None
        for temp in (0.0, 1.0):
            s = MeasureSettings(
                method=method, k=depth, temperature=temp, tree=tree, seed=1,
                max_new_tokens=args.max_new_tokens, device="cpu",
            )  # fmt: skip
            o = measure_pair(p.target_v1, ddir, prompts, s).overall
            depths = " / ".join("–" if x is None else f"{x:.2f}" for x in
                                o["per_position_conditional"])  # fmt: skip
            cells += [_f(o["alpha"], 3), _f(o["tau"], 2), depths]
            nodes = o["draft_tokens_per_step"]
        print(f"| {label} | {depth} | " + " | ".join(cells) + f" | {_f(nodes, 1)} |", flush=True)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


def _f(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


if __name__ == "__main__":
    raise SystemExit(main())
