"""The serving-configuration facts read from a pair's files, shared by the runner (which
records them with every measurement) and the registry (which checks a deployment's
measurement and export against them): the chat-template digest of a target and the
auxiliary layer ids of an EAGLE-3 head. Read from directories, no model loaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def chat_template_digest(model_dir: str | Path | None) -> str | None:
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


def declared_aux_layer_ids(config: dict[str, Any]) -> list[int] | None:
    """The target layers an EAGLE-3 head's ``config.json`` says it fuses (None: it leaves
    them to the engine's default)."""
    aux = config.get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux:
        return None
    return [int(i) for i in aux]


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """The layers an engine fuses for a head that declares none: ``(2, L/2, L-3)`` (vLLM's
    default for most targets, and the runner's; a model class may choose others)."""
    return [2, num_layers // 2, num_layers - 3]


def aux_layer_ids(
    drafter_dir: str | Path | None, target_dir: str | Path | None
) -> list[int] | None:
    """The layers a head fuses when served: those its config declares, else the default
    for the target's layer count (None when neither can be read)."""
    if not drafter_dir:
        return None
    declared = declared_aux_layer_ids(_json(Path(drafter_dir) / "config.json"))
    if declared is not None:
        return declared
    n = _json(Path(target_dir) / "config.json").get("num_hidden_layers") if target_dir else None
    return default_aux_layer_ids(int(n)) if isinstance(n, int) and n >= 3 else None
