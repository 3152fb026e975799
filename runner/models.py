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


def _remote_code_error(path: str | os.PathLike[str], exc: Exception) -> ValueError:
    return ValueError(
        f"{Path(path).name}: the model's code is not in transformers (config.json auto_map); "
        "it runs only once an admin approves these exact bytes (`pairreg artifact "
        "approve-remote-code`), in an isolated worker "
        f"({str(exc).splitlines()[0][:160]})"
    )


def load_causal_lm(
    path: str | os.PathLike[str],
    device: torch.device | str = "cpu",
    dtype: Any = "float32",
    trust_remote_code: bool = False,
):
    """Load a local causal LM directory for inference (eval mode, no grad needed): one
    file or sharded safetensors (``model.safetensors.index.json``), in ``dtype``. Code
    shipped with the checkpoint runs only with ``trust_remote_code``."""
    dev = resolve_device(device) if isinstance(device, str) else device
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code
        )
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise _remote_code_error(path, exc) from exc
        raise
    model.to(dev)
    model.eval()
    return model


def load_tokenizer(path: str | os.PathLike[str], trust_remote_code: bool = False):
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise _remote_code_error(path, exc) from exc
        raise


def eos_ids(model, tokenizer=None) -> set[int]:
    """Every id generation stops at: the generation config's and model config's EOS ids,
    the tokenizer's EOS and the chat template's end-of-turn token (ChatML's
    ``<|im_end|>``), as a chat server stops at any of them."""
    from runner.render import end_of_turn_ids

    ids: set[int] = set()
    gc = getattr(model, "generation_config", None)
    for src in (getattr(gc, "eos_token_id", None), getattr(model.config, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, list | tuple):
            ids.update(int(x) for x in src)
    if tokenizer is not None:
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        ids |= end_of_turn_ids(tokenizer)
    vocab = getattr(model.config, "vocab_size", None)
    return {i for i in ids if vocab is None or 0 <= i < vocab}


class CachedLM:
    """A causal LM plus its KV cache, fed a few tokens at a time.

    ``forward`` returns float32 logits and, when asked for, *features*: the post-norm last
    hidden state (what Medusa and EAGLE-1 heads read) or, with ``aux_layers``, the
    concatenated residual stream entering those layers (EAGLE-3's low/middle/high features;
    id ``j`` is the output of layer ``j - 1``, id 0 the embeddings, as vLLM counts them).
    ``rollback`` drops the newest cache entries after a chain rejection; ``keep_tail`` keeps
    only the rows of a verified tree that lie on the accepted path.
    """

    def __init__(
        self, model, want_hidden: bool = False, aux_layers: tuple[int, ...] | None = None
    ) -> None:
        self.model = model
        self.aux_layers = tuple(aux_layers) if aux_layers else None
        self.want_hidden = want_hidden or self.aux_layers is not None
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.length = 0
        self._body = model.base_model
        self._head = model.get_output_embeddings()
        self._fast = _supports_fast_path(model)
        if self.aux_layers is not None:
            n_layers = int(model.config.num_hidden_layers)
            bad = [i for i in self.aux_layers if not 0 <= i < n_layers]
            if bad:
                raise ValueError(
                    f"aux hidden-state layer ids {bad} out of range for a target with "
                    f"{n_layers} layers"
                )

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def forward(
        self,
        ids: torch.Tensor,
        last_only: bool = False,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed ``ids`` (shape ``[n]``); return logits ``[n, V]`` (``[1, V]`` with
        ``last_only``) and features ``[n, F]`` when requested (else ``None``).

        ``positions`` (``[n]``) and an additive 4D ``mask`` (``[1, 1, n, cached + n]``)
        verify a token tree in one pass; without them the tokens are a causal chain."""
        ids = ids.view(1, -1)
        n = ids.shape[1]
        pos = (
            torch.arange(self.length, self.length + n, device=ids.device)
            if positions is None
            else positions.to(ids.device)
        ).unsqueeze(0)
        if self._fast:
            hidden, aux = self._fast_body(ids, pos, mask)
            logits = self._head(hidden[-1:] if last_only else hidden)
        elif not self.want_hidden:
            # the model's own head: some architectures scale or cap logits there
            out = self.model(
                input_ids=ids, cache=self.cache, use_cache=True, position_ids=pos,
                attention_mask=mask,
            )  # fmt: skip
            logits, hidden, aux = out.logits[0], None, None
        else:
            hidden, aux = self._slow_body(ids, pos, mask)
            logits = self._head(hidden[-1:] if last_only else hidden)
        self.length += n
        feats = None
        if self.aux_layers is not None:
            feats = aux
        elif self.want_hidden:
            feats = hidden
        return logits.float(), feats

    def _slow_body(
        self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's own forward; a 4D mask is passed through unchanged by transformers'
        mask preparation, so trees work here too."""
        out = self._body(
            input_ids=ids,
            cache=self.cache,
            use_cache=True,
            position_ids=pos,
            attention_mask=mask,
            output_hidden_states=self.aux_layers is not None,
        )
        aux = None
        if self.aux_layers is not None:
            aux = torch.cat([out.hidden_states[i][0] for i in self.aux_layers], dim=-1)
        return out.last_hidden_state[0], aux

    def _fast_body(
        self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder stack without the model-level wrappers (output capture, kwarg
        deprecation, output dataclasses), which dominate per-call cost for small models
        at batch size 1. It calls the very same embedding, rotary, mask, layer and norm
        modules in the same order as ``LlamaModel.forward``, so results are identical."""
        body = self._body
        h = body.embed_tokens(ids)
        if mask is None:
            mask = create_causal_mask(
                config=body.config,
                inputs_embeds=h,
                attention_mask=None,
                cache=self.cache,
                position_ids=pos,
            )
        pe = body.rotary_emb(h, position_ids=pos)
        aux: list[torch.Tensor] = []
        wanted = self.aux_layers or ()
        for i, layer in enumerate(body.layers[: body.config.num_hidden_layers]):
            if i in wanted:
                aux.append(h[0])
            h = layer(
                h,
                attention_mask=mask,
                position_embeddings=pe,
                position_ids=pos,
                cache=self.cache,
                use_cache=True,
            )
        feats = None
        if wanted:
            by_id = dict(zip(sorted(set(wanted)), aux, strict=True))
            feats = torch.cat([by_id[i] for i in wanted], dim=-1)
        return body.norm(h)[0], feats

    def rollback(self, n: int) -> None:
        """Forget the ``n`` newest tokens."""
        if n > 0:
            self.cache.crop(-n)
            self.length -= n

    def keep_tail(self, start: int, rows: list[int]) -> None:
        """Keep cache entries ``[0, start)`` plus the entries at ``start + r`` for each row
        ``r`` (increasing), in that order, and drop the rest: after a tree pass only the
        accepted path stays. Rows are never before their destination, so gathering first and
        then writing in place copies only the kept rows."""
        n_new = self.length - start
        if rows == list(range(len(rows))):
            self.rollback(n_new - len(rows))
            return
        idx = torch.tensor(rows, device=self.device) + start
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t[:, :, start : start + len(rows)] = t.index_select(2, idx)
                setattr(layer, name, t[:, :, : start + len(rows)])
        self.length = start + len(rows)


def tree_mask(
    past: int, parents: list[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Additive attention mask ``[1, 1, n, past + n]`` for ``n`` new tokens whose tree
    parents (index among the new tokens, ``-1`` for none) are given: each new token sees
    the whole cached prefix, its ancestors and itself, and no sibling branch."""
    n = len(parents)
    allowed = torch.zeros(n, past + n, dtype=torch.bool)
    allowed[:, :past] = True
    for i, parent in enumerate(parents):
        allowed[i, past + i] = True
        if parent >= 0:
            allowed[i, past : past + n] |= allowed[parent, past : past + n]
    mask = torch.zeros(n, past + n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.to(device).view(1, 1, n, past + n)


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
