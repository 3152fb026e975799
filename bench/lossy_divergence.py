"""Divergence of lossy (typical-acceptance) pairs from the target's own greedy output, on the
shipped adversarial suite, with and without a strict prefix.

    .venv/bin/python bench/lossy_divergence.py --prefixes 0,4,8,16 --first 8,16,32

Registers the tiny reference target and draft (in the builders' cache, where the test
suite builds them, or ``--tiny DIR``) in a scratch SQLite registry, then for each strict prefix
length measures the pair (draft model, k=4, greedy, typical acceptance with Medusa's
threshold ε and α given explicitly) on every adversarial prompt through the same
measurement path workers use (``runner.executor.RunnerExecutor``, which records where each
output first leaves plain greedy decoding). Prints one row per (prefix, N): the share of
prompts whose output diverges within the first N tokens — what the ``lossy.adversarial``
gate compares with ``max_divergence_rate``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("PAIRREG_MLFLOW", "0")

from builders.tiny import default_tiny_dir  # noqa: E402
from registry import db  # noqa: E402
from registry.db import session_scope  # noqa: E402
from registry.governance.policy import measurement_settings  # noqa: E402
from registry.jobloop import MeasureTask  # noqa: E402
from registry.services import artifacts, pairs  # noqa: E402
from runner.executor import RunnerExecutor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", default=str(default_tiny_dir()))
    ap.add_argument("--prefixes", default="0,4,8,16")
    ap.add_argument("--first", default="8,16,32")
    ap.add_argument("--epsilon", type=float, default=0.09)
    ap.add_argument("--alpha", type=float, default=0.3, help="Medusa's α (typical_delta)")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    tiny = Path(args.tiny)
    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'r.db'}"
    db.upgrade(url)
    with session_scope(url) as s:
        t = artifacts.add_artifact(
            s, source=str(tiny / "target-v1"), name="tiny/t", role="target", actor="bench"
        ).artifact
        d = artifacts.add_artifact(
            s, source=str(tiny / "draft"), name="tiny/d", role="draft", actor="bench"
        ).artifact
    suite = {
        "name": "default",
        "categories": ["adversarial"],
        "prompts_per_category": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "temperature": 0.0,
        "seed": 0,
    }
    rows = []
    for prefix in (int(x) for x in args.prefixes.split(",")):
        options = {
            "acceptance": "typical",
            "typical_epsilon": args.epsilon,
            "typical_delta": args.alpha,
            "strict_prefix_tokens": prefix,
        }
        with session_scope(url) as s:
            pair = pairs.register_pair(
                s,
                target=t.ref,
                draft=d.ref,
                method="draft_model",
                k=4,
                options=options,
                actor="bench",
            ).pair
        started = time.perf_counter()
        task = MeasureTask(
            pair_digest=pair.pair_digest,
            lossy=pair.lossy,
            settings=measurement_settings(pair.config, suite),
            suite_name="default",
            categories=["adversarial"],
            prompts_per_category=args.prompts,
            target_dir=str(tiny / "target-v1"),
            drafter_dir=str(tiny / "draft"),
            device="cpu",
            divergence_categories=["adversarial"],
        )
        out = RunnerExecutor(log_runs=False).measure(task)
        at = [p["divergence_at"] for p in out["result"]["prompts"]]
        for n in (int(x) for x in args.first.split(",")):
            diverged = sum(1 for a in at if a is not None and a < n)
            rows.append(
                {
                    "strict_prefix_tokens": prefix,
                    "first_tokens": n,
                    "diverged": diverged,
                    "prompts": len(at),
                    "rate": round(diverged / len(at), 4),
                    "alpha": round(out["result"]["overall"]["alpha"], 4),
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"epsilon": args.epsilon, "alpha": args.alpha, "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
