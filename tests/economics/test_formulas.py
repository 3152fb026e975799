"""Each formula of the economics model against values computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.economics import facts as ef
from registry.economics import model as em
from registry.economics.hardware import HardwareProfile, load_profiles, profile_from_dict
from registry.errors import InvalidInput
from tests.economics.helpers import LLAMA2_7B, LLAMA3_8B, safetensors_bytes

HW = HardwareProfile(
    name="test", memory_bytes=80e9, memory_bandwidth=1e12, flops={"bfloat16": 1e14}
)


def test_kv_bytes_per_token_llama_style() -> None:
    # 2 (K,V) x 32 layers x 32 KV heads x 128 head dim x 2 bytes = 524288 (512 KiB)
    assert ef.kv_bytes_per_token(ef.arch_facts(LLAMA2_7B), 2) == 524_288
    # grouped-query attention: 8 KV heads -> a quarter: 131072 (128 KiB)
    assert ef.kv_bytes_per_token(ef.arch_facts(LLAMA3_8B), 2) == 131_072
    # explicit head_dim wins over hidden / heads; fp32 doubles it
    cfg = {**LLAMA3_8B, "head_dim": 64}
    assert ef.kv_bytes_per_token(ef.arch_facts(cfg), 4) == 2 * 32 * 8 * 64 * 4
    assert ef.kv_bytes_per_token(ef.arch_facts({"hidden_size": 8}), 2) is None


def test_arch_reads_nested_text_config_first() -> None:
    cfg = {"model_type": "llava", "text_config": LLAMA3_8B, "vision_config": {}}
    a = ef.arch_facts(cfg)
    assert (a.num_layers, a.num_key_value_heads, a.head_dim) == (32, 8, 128)


def test_flops_per_token() -> None:
    a = ef.arch_facts(LLAMA2_7B)
    # attention: 4 x 32 layers x 32 heads x 128 x 4096 context = 2,147,483,648
    assert ef.attention_flops_per_token(a, 4096) == 2_147_483_648
    assert ef.flops_per_token(7_000_000_000, a, 4096) == 14_000_000_000 + 2_147_483_648
    assert ef.flops_per_token(10, a, 0) == 20


def test_safetensors_header_counts(tmp_path: Path) -> None:
    data = safetensors_bytes(
        {"a": ("F32", [2, 3]), "b": ("BF16", [4]), "c": ("BF16", [5, 2])}, meta={"format": "pt"}
    )
    (tmp_path / "model.safetensors").write_bytes(data)
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 1}')
    w = ef.weight_facts(tmp_path)
    assert (w.params, w.bytes) == (6 + 4 + 10, 24 + 28)
    assert w.params_by_dtype == {"BF16": 14, "F32": 6}
    assert w.bytes_by_dtype == {"BF16": 28, "F32": 24}
    manifest = [
        {"path": "config.json", "size": 24, "sha256": "x"},
        {"path": "model.safetensors", "size": len(data) + 1, "sha256": "x"},
    ]
    with pytest.raises(ef.FactsError, match="size differs"):
        ef.weight_facts(tmp_path, manifest)
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ef.FactsError, match="out of range"):
        ef.weight_facts(tmp_path)


def test_step_time_roofline_by_hand() -> None:
    arch = ef.arch_facts(LLAMA2_7B)
    t = em.Part(weight_bytes=14e9, params=7e9, kv_bytes_per_token=524_288, arch=arch)
    # memory: (14e9 + 4096 x 524288) / 1e12 = 0.016147483648 s; compute: 1.6e-4 s
    assert em.step_time(t, HW, "bfloat16", batch=1, tokens=1, context=4096) == pytest.approx(
        0.016147483648
    )
    # 64 sequences x 5 tokens at 4096: reading 64 KV caches (0.1514 s) outweighs the
    # compute (320 x 16.1e9 / 1e14 = 0.0517 s): long contexts stay memory-bound
    mem = (14e9 + 64 * 4096 * 524_288) / 1e12
    assert mem > 64 * 5 * (14e9 + 2_147_483_648) / 1e14
    assert em.step_time(t, HW, "bfloat16", batch=64, tokens=5, context=4096) == pytest.approx(mem)
    # short context: compute-bound at 256 x 5 tokens: 1280 x (14e9 + 4 x 32 x 32 x 128 x 128)
    flop = 1280 * (14e9 + 4 * 32 * 32 * 128 * 128) / 1e14
    assert em.step_time(t, HW, "bfloat16", batch=256, tokens=5, context=128) == pytest.approx(flop)
    # fixed overhead per pass: step + layers x per-layer
    slow = profile_from_dict(
        {**_hw_dict(), "step_overhead_s": 0.001, "layer_overhead_s": 0.0001}, kind="user"
    )
    assert em.step_time(t, slow, "bfloat16", batch=1, tokens=1, context=4096) == pytest.approx(
        0.016147483648 + 0.001 + 32 * 0.0001
    )


def _hw_dict() -> dict:
    return {
        "name": "t",
        "memory_bytes": 80e9,
        "memory_bandwidth": 1e12,
        "flops": {"bfloat16": 1e14},
    }


def test_max_batch_by_hand() -> None:
    arch = ef.arch_facts(LLAMA2_7B)
    t = em.Part(14e9, 7e9, 524_288, arch)
    # (80e9 x 0.9 - 14e9) / (4096 x 524288) = 58e9 / 2147483648 = 27.0 -> 27
    assert em.max_batch(HW, [t], 4096) == 27
    d = em.Part(2e9, 1e9, 65_536, ef.arch_facts({**LLAMA3_8B, "num_hidden_layers": 4}))
    # (72e9 - 16e9) / (4096 x (524288 + 65536)) = 56e9 / 2415919104 = 23.18 -> 23
    assert em.max_batch(HW, [t, d], 4096) == 23
    assert em.max_batch(HW, [em.Part(80e9, 1, 1, arch)], 4096) == 0


def test_speedup_cost_and_break_even_by_hand() -> None:
    arch = ef.arch_facts(LLAMA2_7B)
    t = em.Part(14e9, 7e9, 524_288, arch)
    shape = em.shape_for("prompt_lookup", 4, tau=2.5)
    assert (shape.verify_tokens, shape.draft_passes) == (5.0, 0)
    p = em.point(t, None, shape, HW, "bfloat16", batch=1, context=4096, price=3.6)
    # memory-bound at batch 1: verifying 5 tokens costs what 1 does -> speed-up = tau
    assert p.speedup == pytest.approx(2.5)
    assert p.bound == "memory"
    # cost per 1M emitted = 3.6 $/h / 3600 s/h x 0.016147 s / 2.5 tokens x 1e6
    assert p.cost_per_million_emitted == pytest.approx(0.016147483648 / 2.5 * 1e6 / 1000)
    assert p.cost_per_million_plain == pytest.approx(0.016147483648 * 1e6 / 1000)
    assert p.cost_per_million_accepted_draft == pytest.approx(0.016147483648 / 1.5 * 1e3)
    # a chain draft model: gamma passes of the draft at 1 token each
    d = em.Part(1e9, 0.5e9, 65_536, arch)
    sd = em.shape_for("draft_model", 4, tau=2.5)
    p = em.point(t, d, sd, HW, "bfloat16", batch=1, context=4096, price=None)
    draft_pass = (1e9 + 4096 * 65_536) / 1e12
    assert p.draft_s == pytest.approx(4 * draft_pass)
    assert p.speedup == pytest.approx(2.5 * 0.016147483648 / (0.016147483648 + 4 * draft_pass))
    assert p.cost_per_million_emitted is None
    # break-even: first batch below 1 by bisection on a step function
    assert em.break_even_batch(lambda b: 2.0 if b < 37 else 0.9, 1000) == 37
    assert em.break_even_batch(lambda b: 2.0, 1000) is None
    assert em.break_even_batch(lambda b: 0.5, 10) == 1
    assert em.break_even_batch(lambda b: 2.0 if b < 9 else 0.5, 10) == 9
    assert em.measured_prediction(2.0, 0.01, 0.012, 0.003) == pytest.approx(2 * 0.01 / 0.015)


def test_tree_shape_counts_nodes() -> None:
    s = em.shape_for("medusa", 3, tau=2.0, drafted_per_step=14)
    assert (s.verify_tokens, s.draft_passes, s.draft_tokens_per_pass) == (15.0, 1, 1.0)
    s = em.shape_for("eagle", 3, tau=2.0, drafted_per_step=12)
    assert (s.verify_tokens, s.draft_passes, s.draft_tokens_per_pass) == (13.0, 3, 4.0)


def test_shipped_profiles_cite_sources() -> None:
    profiles = load_profiles()
    assert {"h100-sxm", "h200-sxm", "a100-80gb", "l4"} <= set(profiles)
    for p in profiles.values():
        assert "datasheet" in p.source and p.kind == "shipped"
        assert p.flops_for("bfloat16") > p.flops_for("float32")
    assert profiles["h100-sxm"].memory_bandwidth == 3.35e12
    assert profiles["h100-sxm"].flops_for("bfloat16") == 989.5e12


def test_user_profiles_override_and_are_checked(tmp_path: Path) -> None:
    d = tmp_path / "hardware"
    d.mkdir()
    (d / "mine.toml").write_text(
        'name = "l4"\nmemory_bytes = 24e9\nmemory_bandwidth = 2.5e11\n'
        "flops = { bfloat16 = 1e14 }\nprice_per_hour = 0.8\n"
    )
    p = load_profiles(tmp_path)["l4"]
    assert (p.memory_bandwidth, p.price_per_hour, p.kind) == (2.5e11, 0.8, "user")
    (d / "bad.toml").write_text('name = "x"\nmemory_bytes = 1\nmemory_bandwith = 2\nflops = {}\n')
    with pytest.raises(InvalidInput, match="unknown key 'memory_bandwith'"):
        load_profiles(tmp_path)


def _pair_parts(draft_kv: float) -> tuple[em.Part, em.Part]:
    arch = ef.arch_facts(LLAMA3_8B)
    return em.Part(16e9, 8e9, 131_072, arch), em.Part(2e9, 1e9, draft_kv, arch)


def test_monotonic_relations() -> None:
    h100 = load_profiles()["h100-sxm"]
    t, small = _pair_parts(16_384)
    _, big = _pair_parts(131_072)
    # more KV memory for the draft -> a smaller largest batch; plain fits the most
    b_plain = em.max_batch(h100, [t], 4096)
    b_small = em.max_batch(h100, [t, small], 4096)
    b_big = em.max_batch(h100, [t, big], 4096)
    assert b_plain > b_small > b_big > 0
    # a separate draft falls below 1 at large batch on a compute-bound profile
    shape = em.shape_for("draft_model", 4, tau=2.5)

    def speedup(b: int) -> float:
        return em.point(t, small, shape, h100, "bfloat16", batch=b, context=512, price=None).speedup

    series = [speedup(b) for b in (1, 8, 64, 256, 1024)]
    assert series[0] > 1 > series[-1]
    assert all(a >= b for a, b in zip(series, series[1:], strict=False))
    limit = em.max_batch(h100, [t, small], 512)
    be = em.break_even_batch(speedup, limit)
    assert be is not None and speedup(be) < 1 <= speedup(be - 1)
    # a larger draft costs more per step: lower speed-up at every batch
    heavy = em.Part(8e9, 4e9, 16_384, t.arch)
    assert all(
        em.point(t, heavy, shape, h100, "bfloat16", batch=b, context=512, price=None).speedup
        < speedup(b)
        for b in (1, 64)
    )
    # a higher price per hour -> a proportionally higher cost per token
    c1, c2 = (
        em.point(t, small, shape, h100, "bfloat16", batch=8, context=512, price=x)
        for x in (2.0, 4.0)
    )
    assert c2.cost_per_million_emitted == pytest.approx(2 * c1.cost_per_million_emitted)


def test_profile_toml_round_trip(tmp_path: Path) -> None:
    from registry.economics.hardware import profile_toml

    p = profile_from_dict(
        {
            **_hw_dict(),
            "name": "local-cpu",
            "description": 'a "quoted" CPU',
            "step_overhead_s": 1e-4,
            "layer_overhead_s": 2e-5,
            "price_per_hour": 0.1,
            "kind": "measured",
            "measured_at": "2026-12-01T04:00:00Z",
        },
        kind="measured",
    )
    d = tmp_path / "hardware"
    d.mkdir()
    (d / "local-cpu.toml").write_text(profile_toml(p))
    assert load_profiles(tmp_path)["local-cpu"] == p
