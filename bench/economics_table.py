"""Pair economics of the tiny pairs: the table in the README and ``docs/economics.md``.

Usage: ``python bench/economics_table.py [--prompts 8] [--max-new-tokens 64]
[--hardware local-cpu,h100-sxm] [--batch 1,8,64,512] [--context 512] [--price 2.5]``.

In a throw-away ``PAIRREG_HOME``: registers the tiny target and drafters, measures each
pair with the runner (which times every pass and decodes the same prompts plainly),
stores the measurements, measures this machine into the ``local-cpu`` profile (unless
``--no-probe`` or ``--profile FILE``), then asks the ``pair_economics`` operation for each
profile and prints Markdown: the measured batch-1 speed-up beside the model's prediction,
then predicted speed-ups by batch, largest batches, break-even batch and cost per 1M emitted tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--suite", default="code")
    ap.add_argument("--hardware", default="local-cpu,h100-sxm")
    ap.add_argument("--batch", default="1,8,64,512")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--price", type=float, default=2.5)
    ap.add_argument("--tiny-dir", default=None)
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--profile", default=None, help="Use this measured profile TOML instead.")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    home = Path(tempfile.mkdtemp(prefix="pairreg-econ-"))
    os.environ["PAIRREG_HOME"] = str(home)
    os.environ.pop("PAIRREG_URL", None)
    os.environ.pop("PAIRREG_DATABASE_URL", None)
    os.environ["PAIRREG_MLFLOW"] = "0"

    from api.backend import local_backend
    from builders.tiny import build_tiny_pairs
    from registry.economics.hardware import profile_from_dict, profile_toml, user_dir
    from registry.services.system import initialise
    from registry.settings import Settings, reset_settings
    from runner import MeasureSettings, load_suite, measure_pair
    from runner.hardware_probe import measure_profile
    from runner.suites import suite_digest

    reset_settings()
    settings = Settings()
    initialise(settings)
    backend = local_backend(settings)
    if args.profile:
        d = user_dir(home)
        d.mkdir(parents=True, exist_ok=True)
        (d / Path(args.profile).name).write_text(Path(args.profile).read_text())
    elif not args.no_probe:
        prof = profile_from_dict(measure_profile("local-cpu"), kind="measured")
        d = user_dir(home)
        d.mkdir(parents=True, exist_ok=True)
        (d / "local-cpu.toml").write_text(profile_toml(prof))
        print(
            f"local-cpu: {prof.memory_bandwidth / 1e9:.2f} GB/s, float32 "
            f"{prof.flops['float32'] / 1e9:.1f} GFLOPS, overhead "
            f"{prof.step_overhead_s * 1e3:.3f} ms + {prof.layer_overhead_s * 1e3:.3f} ms/layer; "
            f"{prof.description}\n"
        )
    p = build_tiny_pairs(args.tiny_dir)
    backend.add_artifact(source=p.target_v1, name="tiny/target", role="target")
    backend.add_artifact(source=p.draft, name="tiny/draft", role="draft")
    backend.add_artifact(source=p.medusa, name="tiny/medusa", role="heads")
    backend.add_artifact(source=p.eagle, name="tiny/eagle", role="heads")
    rows = [
        ("draft model", "draft_model", "tiny/draft@v1", p.draft, 4),
        ("prompt lookup", "prompt_lookup", None, None, 4),
        ("Medusa chain", "medusa", "tiny/medusa@v1", p.medusa, 3),
        ("EAGLE-1 chain", "eagle", "tiny/eagle@v1", p.eagle, 4),
    ]
    prompts = load_suite(args.suite).prompts[: args.prompts]
    digest = suite_digest(prompts)
    pairs = []
    print("| pair | k | τ | c | measured speed-up, batch 1 | predicted from its step times |")
    print("|---|---|---|---|---|---|")
    for label, method, ref, ddir, k in rows:
        pair = backend.register_pair(target="tiny/target@v1", draft=ref, method=method, k=k).pair
        s = MeasureSettings(method=method, k=k, max_new_tokens=args.max_new_tokens, device="cpu")
        res = measure_pair(p.target_v1, ddir, prompts, s, suite_digest=digest).to_dict()
        backend.store_measurement(
            pair=pair.pair_digest, suite_name=args.suite, suite_digest=digest,
            settings=res["settings"], runner_version=res["runner_version"], result=res,
        )  # fmt: skip
        e = res["economics"]
        pred, meas = e["speedup_predicted"], e["speedup_measured"]
        print(
            f"| {label} | {k} | {res['overall']['tau']:.2f} | {e['cost_ratio_c']:.3f} | "
            f"{meas:.3f} | {pred:.3f} ({pred / meas - 1:+.1%}) |"
        )
        pairs.append((label, pair.pair_digest))
    batches = [int(b) for b in args.batch.split(",")]
    for hw in args.hardware.split(","):
        print(
            f"\n**{hw}** (predicted; context {args.context}, ${args.price}/h, float32 as "
            "measured)\n"
        )
        head = " | ".join(f"speed-up b={b}" for b in batches)
        print(f"| pair | {head} | max batch plain / with drafter | break-even | $/1M b=1 |")
        print("|---|" + "---|" * (len(batches) + 3))
        for label, dig in pairs:
            r = backend.pair_economics(
                pair=dig, hardware=hw, batch=batches, context=args.context, price=args.price
            )
            cells = " | ".join(
                f"{pt.speedup:.2f}" + ("" if pt.fits else " (no fit)") for pt in r.points
            )
            be = "none" if r.break_even_batch is None else str(r.break_even_batch)
            cost = r.points[0].cost_per_million_emitted
            print(
                f"| {label} | {cells} | {r.max_batch_plain} / {r.max_batch_spec} | {be} | "
                f"{cost:.4f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
