"""Tokenizer identity, two ways.

Speculative decoding compares token ids between draft and target, so the pair only works when
both map text to the same ids. Two digests answer two questions:

* :func:`tokenizer_files_digest` — *are these the same files?* The manifest digest (see
  :mod:`registry.artifacts.manifest`) of the tokenizer files present at the top of the directory.
  Byte-exact: reformatting ``tokenizer.json`` changes it.
* :func:`vocab_digest` — *do they assign the same ids?* SHA-256 of the canonical JSON of the
  loaded token→id map, so byte-different but equivalent tokenizers (whitespace, key order,
  metadata) compare equal. Canonical JSON: ``json.dumps(sorted([token, id] pairs),
  separators=(",", ":"))`` with the default ``ensure_ascii=True``, encoded UTF-8.

The vocabulary is loaded with the ``tokenizers`` library from ``tokenizer.json`` (added tokens
included); otherwise from ``vocab.json`` (+ ``added_tokens.json``, GPT-2 style); otherwise from
``vocab.txt`` (WordPiece, id = line number). A SentencePiece-only ``tokenizer.model`` cannot be
read without the sentencepiece library, so such a directory has a files digest but no vocab
digest (``None``): compatibility then rests on the byte-exact files digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from registry.artifacts.manifest import hash_file, manifest_digest

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "vocab.txt",
)


class TokenizerDigestError(Exception):
    """A tokenizer file is present but cannot be read or parsed; the message names it."""


@dataclass(frozen=True)
class VocabDigest:
    """Digest of a token→id map, its size (distinct tokens, added tokens included) and the file
    it was read from. ``vocab_size`` can be below ``config.json``'s ``vocab_size``, which is often
    padded for the embedding matrix."""

    digest: str
    vocab_size: int
    source: str


def tokenizer_files_digest(directory: str | os.PathLike[str]) -> str | None:
    """Manifest digest over the tokenizer files present, or ``None`` when there are none."""
    root = Path(directory)
    entries = []
    for name in TOKENIZER_FILES:
        path = root / name
        if path.is_file():
            fh = hash_file(path)
            entries.append({"path": name, "size": fh.size, "sha256": fh.sha256})
    return manifest_digest(entries) if entries else None


def digest_vocab(vocab: dict[str, int]) -> str:
    """The canonical vocab digest of an in-memory token→id map."""
    pairs = sorted([token, int(idx)] for token, idx in vocab.items())
    text = json.dumps(pairs, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_vocab(directory: str | os.PathLike[str]) -> tuple[dict[str, int], str] | None:
    """Return ``(token→id map, source file name)`` or ``None`` if no readable vocab file."""
    root = Path(directory)
    tok_json = root / "tokenizer.json"
    if tok_json.is_file():
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(tok_json))
        except Exception as exc:  # the Rust side raises a bare Exception subclass
            raise TokenizerDigestError(f"cannot load {tok_json}: {exc}") from exc
        return tok.get_vocab(with_added_tokens=True), "tokenizer.json"
    vocab_json = root / "vocab.json"
    if vocab_json.is_file():
        vocab = _read_int_map(vocab_json)
        added = root / "added_tokens.json"
        if added.is_file():
            vocab.update(_read_int_map(added))
        return vocab, "vocab.json"
    vocab_txt = root / "vocab.txt"
    if vocab_txt.is_file():
        try:
            lines = vocab_txt.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerDigestError(f"cannot read {vocab_txt}: {exc}") from exc
        vocab = {}
        for i, token in enumerate(lines):
            vocab.setdefault(token, i)
        return vocab, "vocab.txt"
    return None


def vocab_digest(directory: str | os.PathLike[str]) -> VocabDigest | None:
    """Digest of the loaded vocabulary (see module docstring), or ``None`` when unavailable."""
    loaded = load_vocab(directory)
    if loaded is None:
        return None
    vocab, source = loaded
    return VocabDigest(digest=digest_vocab(vocab), vocab_size=len(vocab), source=source)


def _read_int_map(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerDigestError(f"cannot parse {path}: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, int) for k, v in data.items()
    ):
        raise TokenizerDigestError(f"{path} is not a JSON object of token → integer id")
    return data
