"""EAGLE-1 and EAGLE-3 draft heads, read and written in the speculators format.

Both heads run one Llama decoder layer of their own beside the target and keep its KV
cache; they differ in what they read and how they emit tokens:

* **EAGLE-1** (Li et al. 2024): the input at position ``i`` is ``fc(concat(embed(t_{i+1}),
  f_i))`` (``fc: Linear(2H, H)``), where ``f_i`` is the target's *post-norm* last hidden
  state at ``i`` (what its LM head reads). The layer's first input norm is an identity, and
  its output is the predicted next feature ``f_{i+1}``, fed back autoregressively; tokens
  come from the **target's** LM head applied to it.
* **EAGLE-3** (Li et al. 2025): the target contributes three *pre-norm* residual-stream
  states (low, middle, high layers; vLLM's default ids ``(2, L // 2, L - 3)``), fused by
  ``fc: Linear(3H, H)``. The decoder layer's attention reads ``concat(input_norm(embed),
  hidden_norm(hidden))`` (2H wide), its own final norm and LM head cover a reduced draft
  vocabulary, and ``d2t`` maps draft ids back to target ids (``target = draft + d2t[draft]``;
  ``t2d`` marks which target ids the draft can emit). The fed-back hidden state is the
  layer's pre-norm output, which is *not* passed through ``fc`` again.

Token embeddings are shared with the target (and, for EAGLE-1, its LM head), as vLLM does
when a checkpoint carries none. Weights use the names vLLM's ``llama_eagle.py`` /
``llama_eagle3.py`` loaders expect (``fc.weight``, ``layers.0.…``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ``t2d``); the speculators names for EAGLE-1 (``fusion_fc.…``,
``transformer.…``) and the original EAGLE-3 name ``midlayer.…`` are read too.

Position convention (vLLM's): the pair ``(t_{i+1}, f_i)`` sits at position ``i``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from registry.artifacts.serving_config import default_aux_layer_ids

WEIGHTS = "model.safetensors"
SPECULATORS_VERSION = "0.3.0"
EAGLE_TYPES = ("eagle", "eagle3")
# the keys pairreg adds to a speculators config.json; vLLM reads none of them
PAIRREG_KEY = "pairreg"


def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 feature layers for a target with ``num_layers`` layers."""
    return default_aux_layer_ids(num_layers)


@dataclass(frozen=True)
class HeadSpec:
    """What a head directory declares (enough to check it against a target)."""

    version: int  # 1 or 3
    layer_config: dict[str, Any]
    hidden_size: int
    vocab_size: int
    target_hidden_size: int
    draft_vocab_size: int
    aux_layers: tuple[int, ...] | None
    norm_before_residual: bool
    fusion_bias: bool


def spec_for_target(
    target_config: Any,
    version: int,
    *,
    draft_vocab_size: int | None = None,
    aux_layers: list[int] | None = None,
    intermediate_size: int | None = None,
    norm_before_residual: bool = False,
) -> HeadSpec:
    """A head shaped for a Llama-style target: its decoder layer copies the target's
    attention geometry (heads, head size, rope, norm eps), as published EAGLE heads do."""
    if version not in (1, 3):
        raise ValueError("EAGLE version must be 1 or 3")
    tc = target_config
    hidden = int(tc.hidden_size)
    layer = {
        "hidden_size": hidden,
        "intermediate_size": int(intermediate_size or tc.intermediate_size),
        "num_attention_heads": int(tc.num_attention_heads),
        "num_key_value_heads": int(getattr(tc, "num_key_value_heads", tc.num_attention_heads)),
        "head_dim": int(getattr(tc, "head_dim", None) or hidden // tc.num_attention_heads),
        "rms_norm_eps": float(tc.rms_norm_eps),
        "max_position_embeddings": int(tc.max_position_embeddings),
        "rope_parameters": dict(getattr(tc, "rope_parameters", None) or {}) or None,
        "hidden_act": str(getattr(tc, "hidden_act", "silu")),
        "attention_bias": bool(getattr(tc, "attention_bias", False)),
        "mlp_bias": bool(getattr(tc, "mlp_bias", False)),
        "vocab_size": int(tc.vocab_size),
        "num_hidden_layers": 1,
        "bos_token_id": getattr(tc, "bos_token_id", None),
        "eos_token_id": getattr(tc, "eos_token_id", None),
        "pad_token_id": getattr(tc, "pad_token_id", None),
        "tie_word_embeddings": False,
    }
    layer = {k: v for k, v in layer.items() if v is not None}
    vocab = int(tc.vocab_size)
    if version == 1:
        return HeadSpec(1, layer, hidden, vocab, hidden, vocab, None, False, False)
    n_layers = int(tc.num_hidden_layers)
    return HeadSpec(
        version=3,
        layer_config=layer,
        hidden_size=hidden,
        vocab_size=vocab,
        target_hidden_size=hidden,
        draft_vocab_size=int(draft_vocab_size or vocab),
        aux_layers=tuple(aux_layers or default_aux_layers(n_layers)),
        norm_before_residual=norm_before_residual,
        fusion_bias=False,
    )


class Eagle3DecoderLayer(nn.Module):
    """One decoder layer whose attention reads ``[embed ; hidden]`` (2H)."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.norm_before_residual = norm_before_residual
        self.self_attn = LlamaAttention(config, layer_idx=0)
        bias = bool(getattr(config, "attention_bias", False))
        attn = self.self_attn
        n_q = config.num_attention_heads * attn.head_dim
        n_kv = config.num_key_value_heads * attn.head_dim
        attn.q_proj = nn.Linear(2 * h, n_q, bias=bias)
        attn.k_proj = nn.Linear(2 * h, n_kv, bias=bias)
        attn.v_proj = nn.Linear(2 * h, n_kv, bias=bias)
        self.mlp = LlamaMLP(config)
        eps = config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: Any,
    ) -> torch.Tensor:
        if self.norm_before_residual:
            hidden = self.hidden_norm(hidden)
            residual = hidden
        else:
            residual = hidden
            hidden = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        attn, _ = self.self_attn(
            hidden_states=x, position_embeddings=position_embeddings, attention_mask=mask,
            cache=cache,
        )  # fmt: skip
        residual = residual + attn
        return residual + self.mlp(self.post_attention_layernorm(residual))


class EagleHead(nn.Module):
    """An EAGLE-1 (``spec.version == 1``) or EAGLE-3 head; call :meth:`attach` with the
    target model before use."""

    def __init__(self, spec: HeadSpec) -> None:
        super().__init__()
        self.spec = spec
        cfg = layer_config(spec)
        self.config = cfg
        h = spec.hidden_size
        if spec.version == 1:
            self.fc = nn.Linear(2 * h, h, bias=spec.fusion_bias)
            layer = LlamaDecoderLayer(cfg, layer_idx=0)
            layer.input_layernorm = nn.Identity()
            self.layers = nn.ModuleList([layer])
        else:
            self.fc = nn.Linear(3 * spec.target_hidden_size, h, bias=False)
            self.layers = nn.ModuleList([Eagle3DecoderLayer(cfg, spec.norm_before_residual)])
            self.norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
            self.lm_head = nn.Linear(h, spec.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(cfg)
        self._shared: tuple[nn.Module, nn.Module] | None = None

    # ------------------------------------------------------------------ wiring

    def attach(self, target) -> EagleHead:
        """Share the target's token embedding (and LM head for EAGLE-1); check sizes."""
        tcfg = target.config
        if int(tcfg.hidden_size) != self.spec.target_hidden_size:
            raise ValueError(
                f"EAGLE head reads hidden size {self.spec.target_hidden_size}, "
                f"target has {tcfg.hidden_size}"
            )
        if int(tcfg.vocab_size) != self.spec.vocab_size:
            raise ValueError(
                f"EAGLE head vocabulary {self.spec.vocab_size} != target {tcfg.vocab_size}"
            )
        if self.spec.version == 3:
            n_layers = int(tcfg.num_hidden_layers)
            bad = [i for i in self.aux_layers(n_layers) if not 0 <= i < n_layers]
            if bad:
                raise ValueError(
                    f"EAGLE-3 head reads target layers {bad}; the target has {n_layers}"
                )
        self._shared = (target.get_input_embeddings(), target.get_output_embeddings())
        return self

    def aux_layers(self, target_layers: int) -> tuple[int, ...]:
        if self.spec.aux_layers is not None:
            return self.spec.aux_layers
        return tuple(default_aux_layers(target_layers))

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, in draft order (EAGLE-3)."""
        return torch.arange(self.spec.draft_vocab_size, device=self.d2t.device) + self.d2t

    # ------------------------------------------------------------------ forward

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features to the layer's hidden input (EAGLE-3 fuses its 3 layers)."""
        return self.fc(features) if self.spec.version == 3 else features

    def forward(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids`` ``[B, n]``, ``hidden`` ``[B, n, H]`` (already fused), ``positions``
        ``[B, n]``, additive ``mask`` ``[B, 1, n, cached + n]``. Returns the fed-back hidden
        state ``[B, n, H]`` and logits over the **target** vocabulary ``[B, n, V]`` (EAGLE-3:
        ``-inf`` outside the draft vocabulary)."""
        if self._shared is None:
            raise RuntimeError("EagleHead.attach(target) first")
        embed, target_head = self._shared
        e = embed(ids).to(hidden.dtype)
        pe = self.rotary_emb(hidden, position_ids=positions)
        if self.spec.version == 1:
            x = self.fc(torch.cat([e, hidden], dim=-1))
            out = self.layers[0](
                x, attention_mask=mask, position_embeddings=pe, position_ids=positions,
                cache=cache, use_cache=cache is not None,
            )  # fmt: skip
            return out, target_head(out)
        out = self.layers[0](e, hidden, mask, pe, cache)
        return out, self.target_logits(self.lm_head(self.norm(out)))

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        shape = (*draft_logits.shape[:-1], self.spec.vocab_size)
        full = draft_logits.new_full(shape, float("-inf"))
        full[..., self.draft_ids] = draft_logits
        return full

    # ------------------------------------------------------------------ files

    def save(self, out_dir: str | os.PathLike[str], verifier: dict[str, Any], k: int) -> None:
        """Write ``model.safetensors`` and a speculators ``config.json``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {
            n: t.detach().contiguous().cpu()
            for n, t in self.state_dict().items()
            if not n.startswith("rotary_emb.")
        }
        save_file(state, str(out / WEIGHTS), metadata={"format": "pt"})
        config = speculators_config(self.spec, verifier, k)
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def layer_config(spec: HeadSpec) -> LlamaConfig:
    d = {k: v for k, v in spec.layer_config.items() if k not in ("architectures", "model_type")}
    d["num_hidden_layers"] = 1
    cfg = LlamaConfig(**d)
    cfg._attn_implementation = "sdpa"
    return cfg


def speculators_config(spec: HeadSpec, verifier: dict[str, Any], k: int) -> dict[str, Any]:
    """The speculators-format config.json for a head (shaped like published ones)."""
    layer = dict(spec.layer_config)
    layer.update(
        {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
            "num_hidden_layers": 1,
        }
    )
    proposal = {
        "proposal_type": "greedy",
        "speculative_tokens": int(k),
        "verifier_accept_k": 1,
        "accept_tolerance": 0.0,
    }
    cfg: dict[str, Any] = {
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle" if spec.version == 1 else "eagle3",
            "proposal_methods": [proposal],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": verifier.get("name_or_path"),
                "architectures": list(verifier.get("architectures") or []),
            },
        },
        "transformer_layer_config": layer,
        "torch_dtype": "float32",
    }
    if spec.version == 1:
        cfg.update(
            {
                "speculators_model_type": "eagle",
                "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
                "transformer_layer_architecture": "LlamaDecoderLayer",
                "layernorms": False,
                "fusion_bias": spec.fusion_bias,
            }
        )
    else:
        cfg.update(
            {
                "speculators_model_type": "eagle3",
                "architectures": ["Eagle3Speculator"],
                "draft_vocab_size": spec.draft_vocab_size,
                "norm_before_residual": spec.norm_before_residual,
                "target_hidden_size": spec.target_hidden_size,
                "eagle_aux_hidden_state_layer_ids": list(spec.aux_layers)
                if spec.aux_layers is not None
                else None,
            }
        )
    return cfg


# --------------------------------------------------------------------------- loading


def eagle_type(path: str | os.PathLike[str]) -> str | None:
    """``eagle`` / ``eagle3`` when ``path`` holds a speculators EAGLE head, else None."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    kind = data.get("speculators_model_type") if isinstance(data, dict) else None
    return kind if kind in EAGLE_TYPES else None


def head_spec(config: dict[str, Any]) -> HeadSpec:
    """Read a speculators EAGLE / EAGLE-3 config.json (dict) into a :class:`HeadSpec`."""
    kind = config.get("speculators_model_type")
    if kind not in EAGLE_TYPES:
        raise ValueError(f"not an EAGLE head config: speculators_model_type={kind!r}")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError("EAGLE head config lacks transformer_layer_config")
    hidden = int(layer["hidden_size"])
    vocab = int(layer["vocab_size"])
    if kind == "eagle":
        return HeadSpec(1, layer, hidden, vocab, hidden, vocab, None, False,
                        bool(config.get("fusion_bias", False)))  # fmt: skip
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    return HeadSpec(
        version=3,
        layer_config=layer,
        hidden_size=hidden,
        vocab_size=vocab,
        target_hidden_size=int(config.get("target_hidden_size") or hidden),
        draft_vocab_size=int(config.get("draft_vocab_size") or vocab),
        aux_layers=tuple(int(i) for i in aux) if aux else None,
        # vLLM reads a missing flag as True for speculators checkpoints
        norm_before_residual=bool(config.get("norm_before_residual", True)),
        fusion_bias=False,
    )


_RENAMES = (("fusion_fc.", "fc."), ("transformer.", "layers.0."), ("midlayer.", "layers.0."))


def load_eagle(path: str | os.PathLike[str]) -> EagleHead:
    """Load a head directory (speculators config + safetensors weights)."""
    p = Path(path)
    config = json.loads((p / "config.json").read_text())
    head = EagleHead(head_spec(config))
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {p}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            for old, new in _RENAMES:
                if name.startswith(old):
                    name = new + name[len(old) :]
            if name.startswith("model."):
                name = name[len("model.") :]
            if name.startswith("embed_tokens.") or (
                name.startswith("lm_head.") and head.spec.version == 1
            ):
                continue  # shared with the target
            if name == "draft_id_to_target_id":
                name = "d2t"
            state[name] = t
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary_emb.")]
    if missing or unexpected:
        raise ValueError(
            f"EAGLE weights in {p} do not fit the config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    head.eval()
    return head
