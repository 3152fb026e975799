"""Tokenizer digests: byte-exact files digest versus loaded-vocabulary digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from registry.artifacts.tokenizer_digest import (
    TokenizerDigestError,
    digest_vocab,
    tokenizer_files_digest,
    vocab_digest,
)

VOCAB = {"[UNK]": 0, "hello": 1, "world": 2, "caf\u00e9": 3, "\u2581the": 4}


def _tokenizer_json() -> str:
    tok = Tokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(["<|eot|>"])
    return tok.to_str()


def test_equivalent_tokenizer_json_same_vocab_different_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    text = _tokenizer_json()
    (a / "tokenizer.json").write_text(text)
    # Same tokenizer, reformatted: other whitespace, reversed key order, and a different
    # irrelevant field (truncation/padding settings do not change the token→id map).
    data = json.loads(text)
    data["truncation"] = {
        "direction": "Right",
        "max_length": 128,
        "strategy": "LongestFirst",
        "stride": 0,
    }
    reordered = dict(reversed(list(data.items())))
    (b / "tokenizer.json").write_text(json.dumps(reordered, indent=4))

    va, vb = vocab_digest(a), vocab_digest(b)
    assert va is not None and vb is not None
    assert va.digest == vb.digest
    assert va.vocab_size == len(VOCAB) + 1 and va.source == "tokenizer.json"
    assert tokenizer_files_digest(a) != tokenizer_files_digest(b)
    assert va.digest == digest_vocab({**VOCAB, "<|eot|>": len(VOCAB)})


def test_different_ids_different_vocab_digest(tmp_path: Path) -> None:
    swapped = dict(VOCAB, hello=2, world=1)
    assert digest_vocab(swapped) != digest_vocab(VOCAB)


def test_vocab_json_with_added_tokens_matches_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(_tokenizer_json())
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "vocab.json").write_text(json.dumps(VOCAB))
    (tmp_path / "gpt2" / "merges.txt").write_text("#version: 0.2\n")
    (tmp_path / "gpt2" / "added_tokens.json").write_text(json.dumps({"<|eot|>": len(VOCAB)}))
    v = vocab_digest(tmp_path / "gpt2")
    assert v is not None and v.source == "vocab.json"
    assert v.digest == vocab_digest(tmp_path / "tok").digest  # type: ignore[union-attr]


def test_vocab_txt_and_files_digest(tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    v = vocab_digest(tmp_path)
    assert v is not None and v.vocab_size == 3
    assert v.digest == digest_vocab({"[PAD]": 0, "[UNK]": 1, "hello": 2})
    d1 = tokenizer_files_digest(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 4}')
    assert tokenizer_files_digest(tmp_path) != d1


def test_none_when_no_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert tokenizer_files_digest(tmp_path) is None
    assert vocab_digest(tmp_path) is None
    # A SentencePiece-only tokenizer has a files digest but no loadable vocab.
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x0b")
    assert tokenizer_files_digest(tmp_path) is not None
    assert vocab_digest(tmp_path) is None


def test_malformed_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerDigestError, match="tokenizer.json"):
        vocab_digest(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "vocab.json").write_text('["a", "b"]')
    with pytest.raises(TokenizerDigestError, match="vocab.json"):
        vocab_digest(tmp_path)
