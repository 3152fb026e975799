"""Small on-disk model directories for registry tests (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def byte_tokenizer_json(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    vocab = {f"<0x{i:02X}>": i for i in range(256)}
    vocab.update({"<s>": 256, "</s>": 257})
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<s>"},
    }
    tok.update(extra or {})
    return tok


def write_fake_model(
    path: Path,
    *,
    hidden_size: int = 64,
    vocab_size: int = 258,
    weights: bytes = b"weights-v1",
    config_extra: dict[str, Any] | None = None,
    tokenizer: bool = True,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden_size,
        "vocab_size": vocab_size,
        "num_hidden_layers": 2,
    }
    config.update(config_extra or {})
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(weights)
    if tokenizer:
        (path / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    return path


def bypass_append_only(conn: Any) -> None:
    """Switch the audit log's append-only triggers off for this connection, as an attacker
    holding the database could: on PostgreSQL a superuser skips triggers for the
    transaction; on SQLite whoever holds the file drops them (they stay dropped)."""
    from sqlalchemy import text

    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        return
    for table in ("audit_events", "audit_tree", "audit_leaves", "log_checkpoints"):
        for verb in ("update", "delete"):
            conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_no_{verb}"))
