"""The serving configuration a measurement was taken under, recorded with it.

A pair's acceptance depends on more than its weights: the engine and its version, the
method and k it runs, the dtype, the chat template that renders the prompts, and for an
EAGLE-3 head the target layers whose hidden states it fuses (vLLM issue #50170: a head
served with the wrong auxiliary layers accepted 1.2 % instead of 58.9 % of its drafts while
the server stayed healthy). Each executor records these facts in the measurement's
``serving_config`` block, read from the verified directories it measured (no model
loaded), so two measurements, or a measurement and what an engine serves, can be told
apart by them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from registry.methods import TABLE


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def chat_template_digest(model_dir: str | None) -> str | None:
    """``sha256:<hex>`` of the chat template a tokenizer ships (``chat_template.jinja``,
    else ``tokenizer_config.json``'s ``chat_template``, as canonical JSON when it is a list
    of named templates); None when it ships none."""
    if not model_dir:
        return None
    root = Path(model_dir)
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        text = jinja.read_text(encoding="utf-8")
    else:
        template = _json(root / "tokenizer_config.json").get("chat_template")
        if not template:
            return None
        text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def eagle3_aux_layer_ids(method: str | None, drafter_dir: str | None) -> list[int] | None:
    """The target layers a head fuses (EAGLE-3), as its config declares them (None for
    methods whose heads fuse none, or a head that leaves them to the engine's default)."""
    spec = TABLE.get(method) if method else None
    if spec is None or not spec.fuses_target_layers or not drafter_dir:
        return None
    aux = _json(Path(drafter_dir) / "config.json").get("eagle_aux_hidden_state_layer_ids")
    return [int(i) for i in aux] if isinstance(aux, list) else None


def serving_config(
    settings: dict[str, Any],
    target_dir: str | None,
    drafter_dir: str | None,
    *,
    engine: str,
    engine_version: str | None,
) -> dict[str, Any]:
    """What the measurement ran under: engine and version, method, k, dtype, acceptance
    rule, chat-template digest, EAGLE-3 auxiliary layer ids."""
    method = settings.get("method")
    return {
        "engine": engine,
        "engine_version": engine_version,
        "method": method,
        "k": settings.get("k"),
        "dtype": settings.get("dtype", "float32"),
        "acceptance": settings.get("acceptance", "strict"),
        "chat_template_digest": chat_template_digest(target_dir),
        "eagle3_aux_layer_ids": eagle3_aux_layer_ids(method, drafter_dir),
    }
