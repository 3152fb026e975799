"""Prompt rendering: token ids exactly as a server would feed the target.

A chat prompt (OpenAI ``messages``) goes through the target tokenizer's own chat template
with the generation prompt, encoded exactly as ``apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)`` does; a raw prompt is encoded exactly as the
tokenizer does by default (``tokenizer(text)``, its own special tokens included). Nothing
is prepended that the tokenizer or template would not add: a model measured on a format
it never sees in production reports an acceptance nobody gets.

What was rendered is part of what was measured, so :func:`rendering_record` names the mode
and the digest of the template text; it is stored with the measurement and its MLflow run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

RAW, CHAT = "raw", "chat"


class RenderError(ValueError):
    """A prompt that cannot be rendered for this target (one readable line)."""


def chat_template(tokenizer: Any) -> str | dict[str, str] | None:
    """The tokenizer's chat template text (a dict when it ships several), or ``None``."""
    tmpl = getattr(tokenizer, "chat_template", None)
    return tmpl or None


def chat_template_digest(tokenizer: Any) -> str | None:
    """SHA-256 of the template text (canonical JSON when the tokenizer ships several)."""
    tmpl = chat_template(tokenizer)
    if tmpl is None:
        return None
    text = tmpl if isinstance(tmpl, str) else json.dumps(tmpl, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _ids(out: Any) -> list[int]:
    """``apply_chat_template``/``__call__`` return a list, a dict or a BatchEncoding."""
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    ids = list(out)
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = list(ids[0])
    return [int(i) for i in ids]


def encode_raw(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer(text)``'s ids, nothing added. An empty result is an error, not a BOS."""
    ids = _ids(tokenizer(text))
    if not ids:
        if text:
            raise RenderError("the prompt encodes to no tokens")
        raise RenderError(
            "empty prompt: the target's tokenizer adds no token (no BOS) to an empty "
            "prompt, so there is nothing to condition on; give a non-empty prompt"
        )
    return ids


def encode_chat(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> list[int]:
    """The template's ids with the generation prompt, as a chat server renders them."""
    if chat_template(tokenizer) is None:
        raise RenderError(
            "the target has no chat template: chat prompts cannot be rendered as served; "
            "use a raw-prompt suite"
        )
    try:
        out = tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
        )
    except Exception as exc:  # jinja raises its own errors (raise_exception in templates)
        raise RenderError(f"the target's chat template rejects these messages: {exc}") from exc
    ids = _ids(out)
    if not ids:
        raise RenderError("the chat template renders these messages to no tokens")
    return ids


def encode_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """A suite prompt (``runner.suites.Prompt``), a raw string or a message list."""
    if isinstance(prompt, str):
        return encode_raw(tokenizer, prompt)
    if isinstance(prompt, list | tuple):
        return encode_chat(tokenizer, prompt)
    messages = getattr(prompt, "messages", None)
    if messages:
        return encode_chat(tokenizer, messages)
    return encode_raw(tokenizer, prompt.prompt)


def rendering_mode(prompts: Iterable[Any]) -> str:
    """``raw``, ``chat`` or ``mixed`` (a user file may hold both forms)."""
    modes = {CHAT if getattr(p, "messages", None) else RAW for p in prompts}
    if len(modes) == 1:
        return modes.pop()
    return "mixed" if modes else RAW


def check_renderable(tokenizer: Any, prompts: Iterable[Any]) -> None:
    """Refuse a suite with chat prompts on a target without a chat template, before any
    model work, in one line."""
    if rendering_mode(prompts) != RAW and chat_template(tokenizer) is None:
        raise RenderError(
            "the suite has chat prompts but the target has no chat template; "
            "measure it on a raw-prompt suite (e.g. 'default')"
        )


def rendering_record(tokenizer: Any, prompts: Iterable[Any]) -> dict[str, Any]:
    """What a measurement records about how its prompts became ids."""
    mode = rendering_mode(prompts)
    return {
        "mode": mode,
        "chat_template_digest": chat_template_digest(tokenizer) if mode != RAW else None,
        "add_generation_prompt": mode != RAW,
        "add_special_tokens": True,
    }


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """The special token(s) the chat template closes an assistant turn with (ChatML's
    ``<|im_end|>``, Llama 3's ``<|eot_id|>``): generation must stop there as at EOS.

    Found by rendering a one-exchange chat and reading the first special token after
    the assistant's text; templates that refuse the probe contribute nothing."""
    if chat_template(tokenizer) is None:
        return set()
    sentinel = "pairreg-end-of-turn-probe"
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": sentinel}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False)
    except Exception:
        return set()
    if not isinstance(text, str) or sentinel not in text:
        return set()
    tail = text.split(sentinel, 1)[1]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {int(i) for i, t in added.items() if getattr(t, "special", False)}
    for i in _ids(tokenizer(tail, add_special_tokens=False)):
        if i in special:
            return {i}
    return set()
