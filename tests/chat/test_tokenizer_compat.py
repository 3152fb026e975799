"""Tokenizer-exact pair checks: maps, padding, special tokens, chat templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.artifacts.tokenizer_compat import compare_maps, compare_profiles, profile
from registry.db import session_scope
from registry.errors import InvalidInput
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from tests.chat.models import VOCAB, make_chat_model

ACTOR = "token:test"
BASE = {f"t{i}": i for i in range(3000)}


def test_identical_maps_pass():
    f = compare_maps(BASE, dict(BASE), 3000, 3000)
    assert (f.errors, f.warnings, f.notes) == ([], [], [])


def test_padding_up_to_128_passes_with_a_note_and_beyond_is_refused():
    f = compare_maps(BASE, dict(BASE), 3000, 3128)
    assert f.errors == [] and "padded 128 ids" in f.notes[0]
    assert "by 129 ids" in compare_maps(BASE, dict(BASE), 3000, 3129).errors[0]
    assert "smaller than the target's" in compare_maps(BASE, dict(BASE), 3000, 2999).errors[0]


def test_a_moved_token_is_named_with_both_ids():
    draft = dict(BASE)
    draft["t1500"], draft["t2500"] = 2500, 1500
    [err] = compare_maps(BASE, draft, 3000, 3000).errors
    assert (
        err
        == "vocabulary mismatch: token 't1500' is id 1500 in the target but id 2500 in the draft"
    )
    extra = {**{k: v for k, v in BASE.items() if k != "t7"}, "zz": 7}
    assert "'t7' is id 7 in the target but no id" in compare_maps(BASE, extra, 3000, 3000).errors[0]


def test_profiles_locate_the_block_and_name_the_token_when_files_are_at_hand(tmp_path):
    t = make_chat_model(tmp_path / "t", layers=1)
    d = make_chat_model(tmp_path / "d", layers=1, remap={"<|im_end|>": 100})
    tp, dp = profile(t), profile(d)
    assert tp is not None and dp is not None and tp["blocks"] != dp["blocks"]
    assert compare_profiles(tp, dict(tp)).errors == []
    [err] = compare_profiles(tp, dp, VOCAB, VOCAB).errors
    assert err.startswith("vocabulary mismatch: the token→id maps differ at ids 0–1023")
    from registry.artifacts.tokenizer_digest import load_vocab

    maps = (load_vocab(t)[0], load_vocab(d)[0])
    [named] = compare_profiles(tp, dp, VOCAB, VOCAB, load_maps=lambda: maps).errors
    assert named == "vocabulary mismatch: token 'd' is id 100 in the target but id 258 in the draft"


def _artifact(s, path: Path, name: str, role: str) -> str:
    return art_svc.add_artifact(s, source=str(path), name=name, role=role, actor=ACTOR).artifact.ref


def test_pair_registration_checks_the_tokenizers(chat_models, sqlite_url: str, tmp_path: Path):
    swapped = make_chat_model(tmp_path / "swapped", layers=1, remap={"a": ord("b")})
    padded = make_chat_model(tmp_path / "padded", layers=1, vocab_size=VOCAB + 64)
    other_template = make_chat_model(tmp_path / "tmpl", layers=1, template="{{ messages }}")
    with session_scope(sqlite_url) as s:
        target = _artifact(s, chat_models.target, "acme/chat", "target")
        same = pair_svc.register_pair(
            s, target=target, draft=_artifact(s, chat_models.draft, "acme/draft", "draft"),
            method="draft_model", k=3, actor=ACTOR,
        ).pair  # fmt: skip
        assert not [w for w in same.warnings if "token" in w or "template" in w]
        with pytest.raises(InvalidInput) as refused:
            pair_svc.register_pair(
                s, target=target, draft=_artifact(s, swapped, "acme/swapped", "draft"),
                method="draft_model", k=3, actor=ACTOR,
            )  # fmt: skip
        assert "token 'a' is id 97 in the target but id 98 in the draft" in str(refused.value)
        pad = pair_svc.register_pair(
            s, target=target, draft=_artifact(s, padded, "acme/padded", "draft"),
            method="draft_model", k=3, strict=True, actor=ACTOR,
        ).pair  # fmt: skip
        assert any("padded 64 ids" in w for w in pad.warnings)
        tmpl = pair_svc.register_pair(
            s, target=target, draft=_artifact(s, other_template, "acme/tmpl", "draft"),
            method="draft_model", k=3, actor=ACTOR,
        ).pair  # fmt: skip
        assert any(w.startswith("chat templates differ") for w in tmpl.warnings)


def test_draft_only_tokens_pass_only_inside_the_padding():
    padded = {**BASE, "extra": 3050}
    assert compare_maps(BASE, padded, 3000, 3064).errors == []
    [err] = compare_maps(BASE, padded, 3000, 3000).errors
    assert "'extra' is id 3050 in the draft but has no id in the target" in err
