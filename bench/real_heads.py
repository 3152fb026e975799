"""The real pair's EAGLE heads against its distilled draft (``runner_bench.py --real-heads``).

Greedy and temperature-1 α and τ of target-v1 with EAGLE-1 (chain), EAGLE-3 (chain), an
EAGLE-2 dynamic tree on the EAGLE-1 and EAGLE-3 heads (``--top-k``, ``--total-tokens``;
depth ``--k``) and the distilled draft model (chain, ``--k``), measured with
``runner.measure_pair`` on the given suites (chat suites render their messages with the
target's chat template, as served). Builds (or reuses) the heads stage; prints its build
time and a Markdown table, overall and per category.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from builders.real import build_real_pair
from builders.real_heads import build_real_heads
from runner import MeasureSettings, load_suite, measure_pair


def heads(args: argparse.Namespace) -> int:
    paths = build_real_pair(args.real_dir)
    hp = build_real_heads(paths.root)
    meta = json.loads(Path(hp.marker).read_text())
    print(f"heads stage: wall {meta['wall_seconds']} s, CPU {meta['cpu_seconds']} s "
          f"(stages {meta['stage_wall_seconds']}); losses {meta['final_losses']}")  # fmt: skip
    tree = {"kind": "dynamic", "top_k": args.top_k, "total_tokens": args.total_tokens}
    rows = [
        ("draft model", "draft_model", paths.draft, None),
        ("EAGLE-1 chain", "eagle", hp.eagle, None),
        ("EAGLE-3 chain", "eagle3", hp.eagle3, None),
        ("EAGLE-2 tree, EAGLE-1 head", "eagle", hp.eagle, tree),
        ("EAGLE-2 tree, EAGLE-3 head", "eagle3", hp.eagle3, tree),
    ]
    prompts = [p for s in args.suites.split(",") for p in load_suite(s).prompts[: args.prompts]]
    cats = sorted({p.category for p in prompts})
    print(f"real target-v1, suites {args.suites}: {args.prompts} prompts each x "
          f"{args.max_new_tokens} tokens, k={args.k}, EAGLE-2 tree top_k {args.top_k}, "
          f"{args.total_tokens} nodes; T=1 seed 1\n")  # fmt: skip
    head = ["drafter", "T", "α", "τ", *[f"α {c}" for c in cats], *[f"τ {c}" for c in cats],
            "nodes/step"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    t0 = time.perf_counter()
    for label, method, ddir, shape in rows:
        for temp in (0.0, 1.0):
            s = MeasureSettings(
                method=method, k=args.k, temperature=temp, tree=shape, seed=1,
                max_new_tokens=args.max_new_tokens, device="cpu",
            )  # fmt: skip
            res = measure_pair(paths.target_v1, ddir, prompts, s, plain_baseline=False)
            o, c = res.overall, res.categories
            cells = [label, f"{temp:g}", _f(o["alpha"], 3), _f(o["tau"], 2)]
            cells += [_f(c[x]["alpha"], 3) for x in cats] + [_f(c[x]["tau"], 2) for x in cats]
            cells.append(_f(o["draft_tokens_per_step"], 1))
            print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


def _f(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"
