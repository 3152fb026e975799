"""Loading models and running single forward passes with a KV cache.

transformers 5.x renamed the cache keyword: the installed version takes ``cache=`` on
``forward`` (``past_key_values=`` is a deprecated alias) and returns ``.cache``.
``DynamicCache.crop(n)`` only accepts ``n <= 0`` and then drops ``|n|`` entries from the
end, which is exactly the rollback a rejected draft needs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.utils import logging as hf_logging

# Loading a few-MB model prints a per-tensor progress bar that drowns the CLI's own.
hf_logging.disable_progress_bar()

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available; asking for CUDA without one is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but CUDA is not available")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ValueError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def load_causal_lm(
    path: str | os.PathLike[str], device: torch.device | str = "cpu", dtype: Any = "float32"
):
    """Load a local causal LM directory for inference (eval mode, no grad needed)."""
    dev = resolve_device(device) if isinstance(device, str) else device
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype))
    model.to(dev)
    model.eval()
    return model


def load_tokenizer(path: str | os.PathLike[str]):
    return AutoTokenizer.from_pretrained(str(path))


def eos_ids(model, tokenizer=None) -> set[int]:
    """All EOS ids the model's generation config or tokenizer declares."""
    ids: set[int] = set()
    gc = getattr(model, "generation_config", None)
    for src in (getattr(gc, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, list | tuple):
            ids.update(int(x) for x in src)
    if not ids and tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


class CachedLM:
    """A causal LM plus its KV cache, fed a few tokens at a time.

    ``forward`` returns float32 logits (and optionally the last hidden states, which
    Medusa heads read); ``rollback`` drops the newest cache entries after a rejection.
    """

    def __init__(self, model, want_hidden: bool = False) -> None:
        self.model = model
        self.want_hidden = want_hidden
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.length = 0
        self._body = model.base_model
        self._head = model.get_output_embeddings()
        self._fast = _supports_fast_path(model)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def forward(
        self, ids: torch.Tensor, last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``ids`` (shape ``[n]``); return logits ``[n, V]`` (``[1, V]`` with
        ``last_only``) and hidden ``[n, H]`` when requested."""
        ids = ids.view(1, -1)
        if self._fast:
            hidden = self._fast_body(ids)
            logits = self._head(hidden[-1:] if last_only else hidden)
            self.length += ids.shape[1]
            return logits.float(), (hidden if self.want_hidden else None)
        if self.want_hidden:
            out = self._body(input_ids=ids, cache=self.cache, use_cache=True)
            hidden = out.last_hidden_state[0]
            logits = self._head(hidden)
        else:
            out = self.model(input_ids=ids, cache=self.cache, use_cache=True)
            logits = out.logits[0]
            hidden = None
        self.length += ids.shape[1]
        return logits.float(), hidden

    def _fast_body(self, ids: torch.Tensor) -> torch.Tensor:
        """The decoder stack without the model-level wrappers (output capture, kwarg
        deprecation, output dataclasses), which dominate per-call cost for small models
        at batch size 1. It calls the very same embedding, rotary, mask, layer and norm
        modules in the same order as ``LlamaModel.forward``, so results are identical."""
        body = self._body
        h = body.embed_tokens(ids)
        n = ids.shape[1]
        pos = torch.arange(self.length, self.length + n, device=ids.device).unsqueeze(0)
        mask = create_causal_mask(
            config=body.config,
            inputs_embeds=h,
            attention_mask=None,
            cache=self.cache,
            position_ids=pos,
        )
        pe = body.rotary_emb(h, position_ids=pos)
        for layer in body.layers[: body.config.num_hidden_layers]:
            h = layer(
                h,
                attention_mask=mask,
                position_embeddings=pe,
                position_ids=pos,
                cache=self.cache,
                use_cache=True,
            )
        return body.norm(h)[0]

    def rollback(self, n: int) -> None:
        """Forget the ``n`` newest tokens."""
        if n > 0:
            self.cache.crop(-n)
            self.length -= n


_FAST_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def _supports_fast_path(model) -> bool:
    """Only for architectures whose model-level forward is exactly embed -> rotary ->
    causal mask -> layers -> norm (checked by model_type), with full attention."""
    body = getattr(model, "base_model", None)
    cfg = model.config
    return (
        getattr(cfg, "model_type", None) in _FAST_TYPES
        and getattr(cfg, "sliding_window", None) in (None, 0)
        and all(hasattr(body, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))
        and os.environ.get("PAIRREG_RUNNER_SLOW_PATH") != "1"
    )


def is_local_dir(path: str | os.PathLike[str] | None) -> bool:
    return path is not None and Path(path).is_dir()
