"""Small real safetensors files and Llama-style configs for the economics tests."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

BYTES = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1}

LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "torch_dtype": "bfloat16",
}
LLAMA3_8B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], meta: Any = None) -> bytes:
    """A valid safetensors file of zero-filled tensors."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = math.prod(shape) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if meta is not None:
        header["__metadata__"] = meta
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)
