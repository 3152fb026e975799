"""Compute and memory facts of an artifact, from its registered files without loading it.

Parameter counts and bytes by dtype come from the safetensors headers (the first 8 bytes
give the header length, the header is JSON naming each tensor's dtype and shape), so a
70B checkpoint is described by reading a few hundred kilobytes. KV-cache bytes per token
come from ``config.json``: 2 (K and V) × layers × KV heads × head dim × bytes per element.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Bytes per element of each safetensors dtype (the format's own names).
SAFETENSORS_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 0.5,
}
# config ``torch_dtype`` / pair ``dtype`` names → bytes per element
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit


class FactsError(Exception):
    """A weights file or config cannot be read as what it claims to be."""


@dataclass(frozen=True)
class WeightFacts:
    """Parameter count and bytes, in total and by dtype (safetensors names)."""

    params: int
    bytes: int
    params_by_dtype: dict[str, int] = field(default_factory=dict)
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    source: str = "safetensors"  # or "file sizes" when only other formats exist
    files: int = 0


@dataclass(frozen=True)
class ArchFacts:
    """What the KV cache and attention cost: from config.json."""

    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    torch_dtype: str | None = None


@dataclass(frozen=True)
class EconomicFacts:
    """Everything the economics model needs to know about one artifact."""

    weights: WeightFacts
    arch: ArchFacts

    def to_dict(self) -> dict[str, Any]:
        return {"weights": asdict(self.weights), "arch": asdict(self.arch)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EconomicFacts:
        return cls(WeightFacts(**data["weights"]), ArchFacts(**data["arch"]))


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name → dtype, shape, offsets)."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise FactsError(f"{path}: too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n <= 0 or n > _MAX_HEADER:
            raise FactsError(f"{path}: safetensors header length {n} out of range")
        body = fh.read(n)
    if len(body) != n:
        raise FactsError(f"{path}: truncated safetensors header")
    try:
        header = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FactsError(f"{path}: safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise FactsError(f"{path}: safetensors header is not an object")
    return header


def tensor_counts(header: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """``(params_by_dtype, bytes_by_dtype)`` of one safetensors header."""
    params: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or "dtype" not in info or "shape" not in info:
            raise FactsError(f"tensor {name!r} lacks dtype or shape")
        dtype = str(info["dtype"])
        if dtype not in SAFETENSORS_BYTES:
            raise FactsError(f"tensor {name!r} has unknown dtype {dtype!r}")
        count = math.prod(int(d) for d in info["shape"])
        params[dtype] = params.get(dtype, 0) + count
        nbytes[dtype] = nbytes.get(dtype, 0) + int(count * SAFETENSORS_BYTES[dtype])
    return params, nbytes


_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".gguf")


def weight_facts(
    directory: str | os.PathLike[str], manifest: list[dict[str, Any]] | None = None
) -> WeightFacts:
    """Parameters and bytes of the weights in ``directory``.

    With a manifest, only files it lists are read and each one's size must match it (the
    header is part of the file the manifest hashes; a size change means different bytes).
    Without safetensors files, weight files' sizes are counted at the config dtype.
    """
    root = Path(directory)
    sizes = {e["path"]: int(e["size"]) for e in manifest} if manifest is not None else None
    names = (
        sorted(sizes)
        if sizes is not None
        else sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    )
    st = [n for n in names if n.endswith(".safetensors")]
    params: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    if st:
        for name in st:
            path = root / name
            if sizes is not None and path.stat().st_size != sizes[name]:
                raise FactsError(f"{name}: size differs from the registered manifest")
            p, b = tensor_counts(read_safetensors_header(path))
            for k, v in p.items():
                params[k] = params.get(k, 0) + v
            for k, v in b.items():
                nbytes[k] = nbytes.get(k, 0) + v
        return WeightFacts(
            params=sum(params.values()),
            bytes=sum(nbytes.values()),
            params_by_dtype=dict(sorted(params.items())),
            bytes_by_dtype=dict(sorted(nbytes.items())),
            source="safetensors",
            files=len(st),
        )
    other = [n for n in names if n.endswith(_WEIGHT_SUFFIXES)]
    total = sum(sizes[n] if sizes is not None else (root / n).stat().st_size for n in other)
    return WeightFacts(params=0, bytes=total, source="file sizes", files=len(other))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def arch_facts(config: dict[str, Any] | None) -> ArchFacts:
    """Layer, head and size figures from a config (nested text configs first when present)."""
    if not config:
        return ArchFacts()
    configs = [config]
    for nested in ("text_config", "llm_config", "language_config", "transformer_layer_config"):
        sub = config.get(nested)
        if isinstance(sub, dict):
            configs.insert(0 if nested == "text_config" else len(configs), sub)

    def first(*keys: str) -> int | None:
        for cfg in configs:
            for key in keys:
                v = _int(cfg.get(key))
                if v is not None:
                    return v
        return None

    layers = first("num_hidden_layers", "n_layer", "num_layers")
    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head", "num_heads")
    kv_heads = first("num_key_value_heads", "num_kv_heads", "n_head_kv") or heads
    head_dim = first("head_dim")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    dtype = config.get("torch_dtype") or config.get("dtype")
    return ArchFacts(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        torch_dtype=dtype if isinstance(dtype, str) else None,
    )


def kv_bytes_per_token(arch: ArchFacts, bytes_per_element: float) -> int | None:
    """2 (K and V) × layers × KV heads × head dim × bytes per element; None if unknown."""
    if not (arch.num_layers and arch.num_key_value_heads and arch.head_dim):
        return None
    return int(2 * arch.num_layers * arch.num_key_value_heads * arch.head_dim * bytes_per_element)


def attention_flops_per_token(arch: ArchFacts, context: int) -> int:
    """Attention's FLOPs for one new token over ``context`` cached tokens: QKᵀ and A·V,
    each 2 × heads × head dim per layer per cached token."""
    if not (arch.num_layers and arch.num_attention_heads and arch.head_dim):
        return 0
    return 4 * arch.num_layers * arch.num_attention_heads * arch.head_dim * int(context)


def flops_per_token(params: int, arch: ArchFacts, context: int) -> int:
    """≈ 2 × parameters (one multiply-add per weight) plus attention at ``context``."""
    return 2 * int(params) + attention_flops_per_token(arch, context)


def read_facts(
    directory: str | os.PathLike[str], manifest: list[dict[str, Any]] | None = None
) -> EconomicFacts:
    """:class:`EconomicFacts` of the artifact in ``directory``."""
    from registry.artifacts.model_facts import ModelFactsError, read_config

    try:
        config = read_config(directory)
    except ModelFactsError as exc:
        raise FactsError(str(exc)) from exc
    return EconomicFacts(weight_facts(directory, manifest), arch_facts(config))
