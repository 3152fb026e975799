"""Measure this machine into a hardware profile (``pairreg hardware measure``).

Four figures, each timed with torch on the runner's device (CPU here; the GPU when asked):

* memory bandwidth: a large tensor copy (bytes read + bytes written) / time, best of N;
* dense FLOPS per dtype: square matmuls, 2·n³ / time, best of N;
* per-pass overhead: a 1-token forward of a randomly initialised Llama with 1 and with 4
  layers (hidden 64, so the arithmetic is negligible): the difference per layer is
  ``layer_overhead_s``, the rest ``step_overhead_s``. Small models on a CPU spend most of a
  forward pass here, so without it a roofline would predict them far too fast;
* memory size: physical memory (CPU) or the device's total memory (GPU).

The numbers depend on load: measure on an idle machine, and say so if you cannot.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import UTC, datetime
from typing import Any

import torch


def _best(fn: Any, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def bandwidth(device: torch.device, mib: int = 256, repeats: int = 5) -> float:
    n = mib * 1024 * 1024 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = _best(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / t


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 3) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    t = _best(lambda: torch.mm(a, b), repeats)
    return 2 * n**3 / t


def _llama(layers: int, device: torch.device) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).to(device).eval()


@torch.inference_mode()
def forward_overhead(device: torch.device, repeats: int = 30) -> tuple[float, float]:
    """``(step_overhead_s, layer_overhead_s)`` from 1-token forwards of 1- and 4-layer
    models through the engine's own cached forward (median of ``repeats``, each over the
    same 16-token cache)."""
    from runner.models import CachedLM

    times: dict[int, float] = {}
    for layers in (1, 4):
        lm = CachedLM(_llama(layers, device))
        lm.forward(torch.arange(16, device=device))
        nxt = torch.tensor([3], device=device)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            lm.forward(nxt, last_only=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
            lm.rollback(1)
        samples.sort()
        times[layers] = samples[len(samples) // 2]
    per_layer = max((times[4] - times[1]) / 3, 0.0)
    return max(times[1] - per_layer, 0.0), per_layer


def memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def measure_profile(name: str, device: str = "cpu", quick: bool = False) -> dict[str, Any]:
    """A profile dict (the keys :func:`registry.economics.hardware.profile_from_dict` takes)."""
    dev = torch.device(device)
    n = 512 if quick else 1024
    flops = {"float32": matmul_flops(dev, torch.float32, n)}
    flops["bfloat16"] = matmul_flops(dev, torch.bfloat16, n)
    if dev.type == "cuda":
        flops["float16"] = matmul_flops(dev, torch.float16, n * 4)
        flops["bfloat16"] = matmul_flops(dev, torch.bfloat16, n * 4)
    step, per_layer = forward_overhead(dev, repeats=10 if quick else 30)
    label = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
    return {
        "name": name,
        "description": f"measured on {platform.node()}: {label or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads",
        "memory_bytes": memory_bytes(dev),
        "memory_bandwidth": bandwidth(dev, 64 if quick else 256),
        "flops": flops,
        "step_overhead_s": step,
        "layer_overhead_s": per_layer,
        "source": "measured by pairreg hardware measure (tensor copy, square matmuls, "
        "1-token forwards of 1- and 4-layer Llama models)",
        "kind": "measured",
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
