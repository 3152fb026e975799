"""``pairreg economics PAIR`` and ``pairreg hardware list|measure``: parse, call, render."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cli.backend import get_backend
from cli.render import console, kv, print_json, table
from registry.errors import InvalidInput
from registry.records.economics import EconomicsReport
from registry.records.lifecycle import KSchedule

JSON = typer.Option(False, "--json", help="Machine-readable output.")
hardware_app = typer.Typer(no_args_is_help=True, help="Hardware profiles for pair economics.")


def parse_batches(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(
            f"--batch must be comma-separated integers, got {text!r}", field="batch"
        ) from None
    if not out:
        raise InvalidInput("--batch lists no batch size", field="batch")
    return out


def _money(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _si(v: float, unit: str) -> str:
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def show_report(r: EconomicsReport) -> None:
    hw = r.hardware
    parts = [r.target] + ([r.drafter] if r.drafter else [])
    kv(
        f"pair {r.pair_id} economics on {hw.name} ({hw.kind})",
        [
            ("pair", f"{r.pair_digest[:12]} {r.method} k={r.k}{' tree' if r.tree else ''}"),
            ("τ", f"{r.tau:.3f} ({r.tau_source})"),
            ("hardware", f"{hw.description}; {hw.source}"),
            ("dtype, context", f"{r.dtype}, {r.context} tokens"),
            (
                "price per hour",
                "-" if r.price_per_hour is None else f"{r.price_per_hour:g}",
            ),
        ]
        + [
            (
                p.role,
                f"{p.ref}: {_si(p.params, '')}params, {_si(p.weight_bytes, 'B')}, "
                f"KV {_si(p.kv_bytes_per_token, 'B')}/token",
            )
            for p in parts
        ]
        + [
            ("max batch", f"{r.max_batch_plain} plain, {r.max_batch_spec} with the drafter"),
            ("drafter memory", f"{r.draft_memory_fraction:.2%} of planned memory"),
            (
                "break-even batch",
                "speculation pays at every batch that fits"
                if r.break_even_batch is None
                else f"speed-up < 1 from batch {r.break_even_batch}",
            ),
        ],
    )
    table(
        "predicted (roofline model; see docs/economics.md)",
        [
            "batch",
            "fits",
            "speed-up",
            "bound",
            "plain tok/s",
            "spec tok/s",
            "$/1M plain",
            "$/1M emitted",
            "$/1M accepted draft",
        ],
        [
            (
                p.batch,
                "yes" if p.fits else "no",
                f"{p.speedup:.3f}",
                p.bound,
                _num(p.plain_tokens_per_s),
                _num(p.spec_tokens_per_s),
                _money(p.cost_per_million_plain),
                _money(p.cost_per_million_emitted),
                _money(p.cost_per_million_accepted_draft),
            )
            for p in r.points
        ],
    )
    m = r.measured
    if m is not None and m.speedup_measured is not None:
        pred = "-" if m.speedup_predicted is None else f"{m.speedup_predicted:.3f}"
        err = "" if m.prediction_error is None else f" ({m.prediction_error:+.1%})"
        console.print(
            f"measured at batch 1 (measurement {m.measurement_id}, "
            f"{m.hardware.get('device', '?')}): speed-up {m.speedup_measured:.3f}; "
            f"predicted from its step times {pred}{err}; c = "
            + ("-" if m.cost_ratio_c is None else f"{m.cost_ratio_c:.3f}"),
            highlight=False,
        )
    for note in r.notes:
        console.print(f"note: {note}", highlight=False)


def show_compare(r: EconomicsReport, o: EconomicsReport) -> None:
    rows = []
    for a, b in zip(r.points, o.points, strict=True):
        ca, cb = a.cost_per_million_emitted, b.cost_per_million_emitted
        if ca is not None and cb is not None:
            cheaper = f"pair {r.pair_id}" if ca < cb else f"pair {o.pair_id}"
        else:  # no price: the faster one per token is the cheaper one
            faster = (a.spec_tokens_per_s or 0.0) > (b.spec_tokens_per_s or 0.0)
            cheaper = f"pair {r.pair_id}" if faster else f"pair {o.pair_id}"
        rows.append(
            (
                a.batch,
                f"{a.speedup:.3f}{'' if a.fits else ' (no fit)'}",
                f"{b.speedup:.3f}{'' if b.fits else ' (no fit)'}",
                _money(ca),
                _money(cb),
                cheaper,
            )
        )
    table(
        f"pair {r.pair_id} ({r.method}) vs pair {o.pair_id} ({o.method}) on {r.hardware.name}, "
        "predicted",
        [
            "batch",
            f"speed-up {r.pair_id}",
            f"speed-up {o.pair_id}",
            f"$/1M {r.pair_id}",
            f"$/1M {o.pair_id}",
            "cheaper",
        ],
        rows,
    )


def economics(
    pair: str = typer.Argument(..., help="Pair id or digest prefix."),
    hardware: str | None = typer.Option(
        None, "--hardware", help="Hardware profile (default: local-cpu if measured, else h100-sxm)."
    ),
    batch: str | None = typer.Option(None, "--batch", help="Batch sizes, e.g. 1,8,32,128."),
    context: int = typer.Option(4096, "--context", help="Tokens per sequence."),
    price: float | None = typer.Option(None, "--price", help="Price per hour."),
    tau: float | None = typer.Option(None, "--tau", help="Use this τ instead of the measured."),
    compare: str | None = typer.Option(None, "--compare", help="Another pair to set beside."),
    json_out: bool = JSON,
) -> None:
    """Does this pair pay off at my batch size, and what does a token cost (predictions)."""
    report = get_backend().pair_economics(
        pair=pair,
        hardware=hardware,
        batch=parse_batches(batch),
        context=context,
        price=price,
        tau=tau,
        compare=compare,
    )
    if json_out:
        print_json(report)
        return
    show_report(report)
    if report.compare is not None:
        console.print()
        show_report(report.compare)
        console.print()
        show_compare(report, report.compare)


@hardware_app.command("list")
def hardware_list(json_out: bool = JSON) -> None:
    """Shipped, measured and user hardware profiles."""
    items = get_backend().list_hardware().items
    if json_out:
        print_json(items)
        return
    table(
        "hardware profiles",
        ["name", "kind", "memory", "bandwidth", "bf16 FLOPS", "price/h", "source"],
        [
            (
                p.name,
                p.kind,
                _si(p.memory_bytes, "B"),
                _si(p.memory_bandwidth, "B/s"),
                _si(p.flops.get("bfloat16", 0.0), "FLOPS"),
                "-" if p.price_per_hour is None else f"{p.price_per_hour:g}",
                p.source,
            )
            for p in items
        ],
    )


@hardware_app.command("measure")
def hardware_measure(
    name: str = typer.Option("local-cpu", "--name", help="Profile name to write."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    price: float | None = typer.Option(None, "--price", help="Price per hour to record."),
    quick: bool = typer.Option(False, "--quick", help="Smaller, noisier probes."),
    json_out: bool = JSON,
) -> None:
    """Measure this machine (bandwidth, FLOPS, per-pass overhead) into
    $PAIRREG_HOME/hardware/NAME.toml, where the registry on this machine reads it."""
    from registry.economics.hardware import profile_from_dict, profile_toml, user_dir
    from registry.settings import get_settings
    from runner.hardware_probe import measure_profile

    data = measure_profile(name, device, quick=quick)
    if price is not None:
        data["price_per_hour"] = price
    profile = profile_from_dict(data, kind="measured")
    out = user_dir(get_settings().home_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = Path(out) / f"{name}.toml"
    path.write_text(profile_toml(profile), encoding="utf-8")
    if json_out:
        print_json({**profile.to_dict(), "path": str(path)})
        return
    console.print(
        f"wrote {path}: bandwidth {_si(profile.memory_bandwidth, 'B/s')}, float32 "
        f"{_si(profile.flops['float32'], 'FLOPS')}, overhead "
        f"{profile.step_overhead_s * 1e3:.3f} ms + {profile.layer_overhead_s * 1e3:.3f} ms/layer",
        highlight=False,
    )


def show_k_schedule(r: KSchedule, err: bool = False) -> None:
    """The schedule with its prediction beside each range."""
    out = Console(stderr=True, soft_wrap=True) if err else console
    out.print(
        f"pair {r.pair_digest[:12]} ({r.method}, k={r.fixed_k}) on {r.hardware}, context "
        f"{r.context}, measurement {r.measurement_id}"
    )
    out.print(
        "acceptance length per k: "
        + ", ".join(
            f"{a.k}:{a.length:.2f}{'*' if a.source == 'extrapolated' else ''}" for a in r.acceptance
        )  # fmt: skip
    )
    t = Table(title="draft length per batch size (predicted tokens/s)")
    for col in ("batch", "k", "tokens/s", "plain", f"fixed k={r.fixed_k}", "gain vs fixed"):
        t.add_column(col, justify="right")
    for g in r.ranges:
        t.add_row(
            f"{g.start_bs}-{g.end_bs}", str(g.k),
            f"{_si(g.tokens_per_s[0], '')}-{_si(g.tokens_per_s[1], '')}",
            f"{_si(g.plain_tokens_per_s[0], '')}-{_si(g.plain_tokens_per_s[1], '')}",
            f"{_si(g.fixed_k_tokens_per_s[0], '')}-{_si(g.fixed_k_tokens_per_s[1], '')}",
            f"{g.gain_over_fixed_k[0]:.2f}x-{g.gain_over_fixed_k[1]:.2f}x",
        )  # fmt: skip
    out.print(t)
    out.print(
        f"mean over batch 1-{r.max_batch}: {r.mean_gain_over_fixed_k:.3f}x the fixed k, "
        f"{r.mean_gain_over_plain:.3f}x plain decoding"
    )
    out.print(f"vLLM speculative_config: {json.dumps(r.vllm)}")
    out.print(f"TensorRT-LLM speculative_config: {json.dumps(r.trtllm)}")
    out.print("SGLang: no per-batch-size draft length setting")
    for n in r.notes:
        out.print(f"note: {n}")


def k_schedule(
    pair: str = typer.Argument(..., help="Pair id or digest prefix."),
    hardware: str | None = typer.Option(None, help="Hardware profile (see `hardware list`)."),
    context: int = typer.Option(4096, help="Tokens per sequence."),
    max_batch: int | None = typer.Option(None, "--max-batch", help="Largest batch size."),
    k_max: int = typer.Option(8, "--k-max", help="Longest draft length to consider."),
    category: str | None = typer.Option(None, help="One category's acceptance."),
    json_out: bool = JSON,
) -> None:
    """Draft length per batch size that maximises predicted throughput (k=0: don't speculate)."""
    r = get_backend().k_schedule(
        pair=pair, hardware=hardware, context=context, max_batch=max_batch, k_max=k_max,
        category=category,
    )  # fmt: skip
    if json_out:
        print_json(r)
        return
    show_k_schedule(r)


def register(app: typer.Typer) -> None:
    app.command("economics")(economics)
    app.command("k-schedule")(k_schedule)
    app.add_typer(hardware_app, name="hardware", help="Hardware profiles for pair economics.")
