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

from typing import Any

from registry.artifacts.serving_config import aux_layer_ids, chat_template_digest
from registry.methods import TABLE

__all__ = ["chat_template_digest", "eagle3_aux_layer_ids", "serving_config"]


def eagle3_aux_layer_ids(
    method: str | None, drafter_dir: str | None, target_dir: str | None = None
) -> list[int] | None:
    """The target layers a head fuses (EAGLE-3) as it ran: those its config declares, else
    the default for the target's layer count, which the runner used and an export then
    writes out (None for methods whose heads fuse none)."""
    spec = TABLE.get(method) if method else None
    if spec is None or not spec.fuses_target_layers or not drafter_dir:
        return None
    return aux_layer_ids(drafter_dir, target_dir)


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
        "eagle3_aux_layer_ids": eagle3_aux_layer_ids(method, drafter_dir, target_dir),
    }
