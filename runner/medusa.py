"""Medusa heads in the reference layout, so heads trained elsewhere load unchanged.

Layout (Cai et al. 2024): head ``i`` is ``Sequential(ResBlock x L, Linear(H, V, bias=False))``
and every head reads the target's last hidden state. Head ``i`` predicts the token
``i + 2`` positions ahead of that hidden state (the target's own LM head predicts ``+1``).
Weights live in ``medusa_lm_head.safetensors`` with keys such as ``0.0.linear.weight`` and
``0.1.weight``; ``config.json`` carries ``medusa_num_heads``, ``medusa_num_layers``,
``base_model_name_or_path``, ``hidden_size`` and ``vocab_size``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"


class ResBlock(nn.Module):
    """``x + SiLU(Linear(x))``; zero-initialised so a fresh head starts as the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """All heads; ``forward(h)`` returns logits of shape ``[num_heads, ..., vocab]``."""

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.heads = nn.ModuleList(
            [
                nn.Sequential(
                    *[ResBlock(hidden_size) for _ in range(num_layers)],
                    nn.Linear(hidden_size, vocab_size, bias=False),
                )
                for _ in range(num_heads)
            ]
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([head(hidden) for head in self.heads], dim=0)

    def save(self, out_dir: str | os.PathLike[str], base_model: str) -> None:
        """Write weights and the Medusa config keys."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.heads.state_dict().items()}
        save_file(state, str(out / MEDUSA_WEIGHTS))
        config = {
            "architectures": ["MedusaModel"],
            "model_type": "medusa",
            "medusa_num_heads": self.num_heads,
            "medusa_num_layers": self.num_layers,
            "base_model_name_or_path": base_model,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
        }
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def is_medusa_dir(path: str | os.PathLike[str]) -> bool:
    """A directory is Medusa heads if its config declares ``medusa_num_heads``."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return "medusa_num_heads" in json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError):
        return False


def load_medusa(path: str | os.PathLike[str]) -> MedusaHeads:
    """Load heads from a directory written by :meth:`MedusaHeads.save` (or Medusa's layout)."""
    p = Path(path)
    cfg = json.loads((p / "config.json").read_text())
    heads = MedusaHeads(
        hidden_size=int(cfg["hidden_size"]),
        vocab_size=int(cfg["vocab_size"]),
        num_heads=int(cfg["medusa_num_heads"]),
        num_layers=int(cfg.get("medusa_num_layers", 1)),
    )
    weights = p / MEDUSA_WEIGHTS
    if weights.is_file():
        state = load_file(str(weights))
    else:
        pt = p / "medusa_lm_head.pt"
        if not pt.is_file():
            raise FileNotFoundError(f"no {MEDUSA_WEIGHTS} or medusa_lm_head.pt in {p}")
        state = torch.load(str(pt), map_location="cpu", weights_only=True)
    heads.heads.load_state_dict(state)
    heads.eval()
    return heads
