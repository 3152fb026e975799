"""Benchmark: tokens per second through a real vLLM against the embedded runner, same pair,
same suite, same k, greedy, measured in one run.

Usage: ``python bench/engine_bench.py [--prompts 8] [--max-new-tokens 64] [--k 4]``
(needs the engine tier's vLLM: ``make engines``, or ``PAIRREG_VLLM_PYTHON``).

The tiny draft-model pair: first the embedded runner measures the prompts one after the
other (batch size 1, its only mode) with ``--threads`` torch threads; then vLLM's CPU build
is started on the same target and draft (the arguments ``pairreg export vllm`` prints, plus
the engine tier's CPU arguments) and the same prompts go through
``runner.vllm_measure.measure_prompts`` (what ``pairreg worker --engine vllm`` runs), once
one at a time and once all in flight, after one untimed warm-up pass; then the runner
again (its better pass counts). Each figure is the completion tokens over the wall time
of its pass; the ratios are vLLM / runner. Greedy
tokens are compared prompt by prompt (they must agree). The runner and vLLM never run at
the same time; vLLM is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from builders.tiny import build_tiny_pairs, default_tiny_dir  # noqa: E402
from runner.measure import measure_pair  # noqa: E402
from runner.models import load_tokenizer  # noqa: E402
from runner.settings import MeasureSettings  # noqa: E402
from runner.suites import load_suite  # noqa: E402
from runner.vllm_measure import VllmClient, measure_prompts  # noqa: E402
from tests.engine.vllm_server import VllmServer, engine_python  # noqa: E402
from tests.serve_process import free_port  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--suite", default="code")
    ap.add_argument("--threads", type=int, default=2, help="the runner's torch threads")
    ap.add_argument("--tiny-dir", default=None)
    args = ap.parse_args(argv)
    python = engine_python()
    if isinstance(python, str):
        print(python, file=sys.stderr)
        return 2
    tiny = build_tiny_pairs(args.tiny_dir or default_tiny_dir())
    prompts = load_suite(args.suite).prompts[: args.prompts]
    settings = {"method": "draft_model", "k": args.k, "max_new_tokens": args.max_new_tokens,
                "temperature": 0.0, "seed": 0}  # fmt: skip

    # the embedded runner: one prompt at a time
    s = MeasureSettings(**settings, device="cpu", num_threads=args.threads)
    measure_pair(tiny.target_v1, tiny.draft, prompts[:1], s, plain_baseline=False)  # warm-up

    def runner_pass() -> tuple[Any, float]:
        t0 = time.monotonic()
        result = measure_pair(tiny.target_v1, tiny.draft, prompts, s, plain_baseline=False)
        return result, time.monotonic() - t0

    runner, first_s = runner_pass()
    runner_tokens = sum(int(r["emitted"]) for r in runner.prompts)

    spec = {"method": "draft_model", "model": tiny.draft, "num_speculative_tokens": args.k}
    served = "tiny-draft"
    vllm_args = ["--model", tiny.target_v1, "--served-model-name", served, "--dtype", "float32",
                 "--speculative-config", json.dumps(spec)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        server = VllmServer(python, vllm_args, free_port(), Path(tmp) / "vllm.log")
        try:
            server.start()
            client = VllmClient(server.url, served)
            measure_prompts(client, prompts, settings)  # warm-up, untimed
            one = measure_prompts(client, prompts, settings, concurrency=1)
            batch = measure_prompts(client, prompts, settings)
        finally:
            server.stop()
    # the runner again once vLLM is gone: the better of its two passes, so a burst of other
    # load on a shared machine during one pass does not decide the ratio
    _, second_s = runner_pass()
    runner_s = min(first_s, second_s)

    eos = {int(load_tokenizer(tiny.target_v1).eos_token_id)}
    same = sum(
        [i for i in e["output_ids"] if i not in eos] == [i for i in r["output_ids"] if i not in eos]
        for e, r in zip(batch["prompts"], runner.prompts, strict=True)
    )
    runner_tps = runner_tokens / runner_s
    out = {
        "pair": "tiny target-v1 + tiny draft, draft_model",
        "prompts": len(prompts),
        "suite": args.suite,
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "vllm": batch["engine"]["version"],
        "runner": {
            "tokens": runner_tokens,
            "seconds": round(runner_s, 3),
            "tokens_per_s": round(runner_tps, 1),
            "threads": args.threads,
            "passes_s": [round(first_s, 3), round(second_s, 3)],
        },
        "vllm_one_at_a_time": one["engine"]["throughput"],
        "vllm_all_in_flight": batch["engine"]["throughput"],
        "ratio_one_at_a_time": round(one["engine"]["throughput"]["tokens_per_s"] / runner_tps, 2),
        "ratio_all_in_flight": round(batch["engine"]["throughput"]["tokens_per_s"] / runner_tps, 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "same_greedy_tokens": f"{same}/{len(prompts)}",
        "draft_acceptance_rate": {
            "vllm": round(batch["overall"]["draft_acceptance_rate"], 4),
            "runner": round(runner.overall["draft_acceptance_rate"], 4),
        },
    }
    print(json.dumps(out, indent=2))
    return 0 if same == len(prompts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
