"""Architecture facts and declared targets, read from an artifact's files without loading it.

Pair registration checks compatibility (vocab size, hidden size for heads) and compares what a
drafter *says* it was trained against with the target actually chosen. Those claims live in
several places depending on the tool that produced the drafter, so all of them are collected,
each tagged with the field it came from:

* ``config.json`` → ``speculators_config.verifier.name_or_path`` (speculators format; the
  verifier's ``architectures`` are kept alongside),
* ``config.json`` → ``base_model_name_or_path`` (Medusa) and ``base_model`` (EAGLE-style),
* ``README.md`` YAML front matter → ``base_model`` (string or list; the Hub model-card field).

A speculators-format draft also gets ``speculators``: its type, algorithm, proposal methods,
default proposal and speculative tokens, verifier, EAGLE-3 fields, the pair config the
proposal implies (:mod:`registry.artifacts.speculators`) and any verifier pin pairreg exported.

A model card whose front matter is not valid YAML is not an error (cards are free text written
by people); it is reported in ``warnings``. A ``config.json`` that is not valid JSON *is* an
error: the facts would otherwise be silently empty. A directory without ``config.json`` (prompt
lookup, some head checkpoints) gives facts with ``None`` fields.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.artifacts import speculators


class ModelFactsError(Exception):
    """``config.json`` exists but cannot be read or is not a JSON object."""


@dataclass(frozen=True)
class DeclaredTarget:
    """One claim about the intended target: where it was found and what it names."""

    source_field: str
    value: str
    architectures: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source_field": self.source_field, "value": self.value}
        if self.architectures is not None:
            out["architectures"] = list(self.architectures)
        return out


@dataclass(frozen=True)
class ModelFacts:
    model_type: str | None = None
    architectures: list[str] = field(default_factory=list)
    hidden_size: int | None = None
    vocab_size: int | None = None
    num_layers: int | None = None
    medusa_num_heads: int | None = None
    medusa_num_layers: int | None = None
    declared_targets: list[DeclaredTarget] = field(default_factory=list)
    has_config: bool = False
    warnings: list[str] = field(default_factory=list)
    speculators: dict[str, Any] | None = None
    # config.json's auto_map: the model's code ships with it, not in transformers
    remote_code: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "architectures": list(self.architectures),
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "medusa_num_heads": self.medusa_num_heads,
            "medusa_num_layers": self.medusa_num_layers,
            "declared_targets": [t.to_dict() for t in self.declared_targets],
            "has_config": self.has_config,
            "warnings": list(self.warnings),
            "speculators": self.speculators,
            "remote_code": self.remote_code,
        }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _first_int(configs: list[dict[str, Any]], *keys: str) -> int | None:
    """First integer found for any of ``keys``, top-level config before nested text config:
    multimodal configs keep the language model's sizes under ``text_config``."""
    for cfg in configs:
        for key in keys:
            v = _int(cfg.get(key))
            if v is not None:
                return v
    return None


def read_config(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Parsed ``config.json`` or ``None`` when absent; :class:`ModelFactsError` when malformed."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFactsError(f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ModelFactsError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    if not isinstance(data, dict):
        raise ModelFactsError(f"{path} must contain a JSON object, found {type(data).__name__}")
    return data


def read_card_metadata(
    directory: str | os.PathLike[str],
) -> tuple[dict[str, Any] | None, str | None]:
    """Model-card front matter via huggingface_hub's offline ``metadata_load``.

    Returns ``(metadata or None, warning or None)``.
    """
    path = Path(directory) / "README.md"
    if not path.is_file():
        return None, None
    from huggingface_hub.repocard import metadata_load

    try:
        return metadata_load(path), None
    except Exception as exc:  # yaml errors, non-dict front matter, decoding errors
        return None, f"README.md front matter ignored: {type(exc).__name__}: {exc}"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str) and value.strip():
        return [value.strip()]
    if isinstance(value, list):
        return [v.strip() for v in value if isinstance(v, str) and v.strip()]
    return []


def declared_targets(
    config: dict[str, Any] | None, card: dict[str, Any] | None
) -> list[DeclaredTarget]:
    """Every claim about the intended target, in a fixed order, without duplicates per field."""
    out: list[DeclaredTarget] = []
    if config:
        spec = config.get("speculators_config")
        if isinstance(spec, dict):
            verifier = spec.get("verifier")
            if isinstance(verifier, dict):
                archs = verifier.get("architectures")
                for name in _strings(verifier.get("name_or_path")):
                    out.append(
                        DeclaredTarget(
                            "config.speculators_config.verifier.name_or_path",
                            name,
                            [a for a in archs if isinstance(a, str)]
                            if isinstance(archs, list)
                            else None,
                        )
                    )
        for key in ("base_model_name_or_path", "base_model"):
            for name in _strings(config.get(key)):
                out.append(DeclaredTarget(f"config.{key}", name))
    if card:
        for name in _strings(card.get("base_model")):
            out.append(DeclaredTarget("README.base_model", name))
    return out


def read_model_facts(directory: str | os.PathLike[str]) -> ModelFacts:
    """Collect :class:`ModelFacts` from ``config.json`` and ``README.md`` in ``directory``."""
    config = read_config(directory)
    card, warning = read_card_metadata(directory)
    warnings = [warning] if warning else []
    targets = declared_targets(config, card)
    if config is None:
        return ModelFacts(declared_targets=targets, warnings=warnings)
    configs = [config]
    # speculators drafts keep their own layer's sizes under transformer_layer_config
    for nested in ("text_config", "llm_config", "language_config", "transformer_layer_config"):
        sub = config.get(nested)
        if isinstance(sub, dict):
            configs.append(sub)
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        model_type = next(
            (c["model_type"] for c in configs[1:] if isinstance(c.get("model_type"), str)), None
        )
    archs = config.get("architectures")
    return ModelFacts(
        model_type=model_type,
        architectures=[a for a in archs if isinstance(a, str)] if isinstance(archs, list) else [],
        hidden_size=_first_int(configs, "hidden_size", "n_embd", "d_model"),
        vocab_size=_first_int(configs, "vocab_size"),
        num_layers=_first_int(configs, "num_hidden_layers", "n_layer", "num_layers"),
        medusa_num_heads=_int(config.get("medusa_num_heads")),
        medusa_num_layers=_int(config.get("medusa_num_layers")),
        remote_code=isinstance(config.get("auto_map"), dict) and bool(config["auto_map"]),
        declared_targets=targets,
        has_config=True,
        warnings=warnings,
        speculators=speculators.facts(config),
    )
