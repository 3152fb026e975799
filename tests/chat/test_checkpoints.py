"""Real checkpoints: sharded safetensors, dtypes on CPU, a non-Llama architecture on the
plain forward, and model code outside transformers refused unless the policy names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from registry.artifacts.model_facts import read_model_facts
from registry.db import session_scope
from registry.governance.policy import parse_policy, remote_code_parts
from registry.services import artifacts as art_svc
from registry.tables import Artifact
from runner import MeasureSettings, measure_pair
from runner.engine import greedy_decode
from runner.models import CachedLM, eos_ids, load_causal_lm, load_tokenizer
from runner.render import encode_prompt
from runner.suites import load_suite
from tests.chat.models import make_chat_model

PROMPTS = load_suite("chat:math_reasoning").prompts[:2]


def _exact(target: Path, rows: list[dict], dtype: str = "float32") -> None:
    tok = load_tokenizer(target)
    model = load_causal_lm(target, dtype=dtype)
    for p, row in zip(PROMPTS, rows, strict=True):
        ids = encode_prompt(tok, p)
        ref = greedy_decode(model, ids, len(row["output_ids"]), eos_ids(model, tok))
        assert row["output_ids"] == ref


def test_sharded_safetensors_hash_and_load(chat_models, sqlite_url: str, tmp_path: Path):
    sharded = make_chat_model(tmp_path / "sharded", layers=2, seed=1, shard_size="20KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    with session_scope(sqlite_url) as s:
        ref = art_svc.add_artifact(
            s, source=str(sharded), name="acme/sharded", role="target", actor="token:test"
        ).artifact.ref
        row = s.scalar(select(Artifact).where(Artifact.lineage == "acme/sharded"))
        assert row is not None
        paths = {e["path"] for e in row.manifest}
        assert art_svc.get_artifact(s, ref=ref).facts["hidden_size"] == 32
    assert {"model.safetensors.index.json", *shards} <= paths
    a, b = load_causal_lm(sharded), load_causal_lm(chat_models.target)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(a(ids).logits, b(ids).logits)  # same seed: the same weights


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_dtypes_run_on_cpu(chat_models, dtype: str):
    s = MeasureSettings(method="draft_model", k=3, max_new_tokens=8, device="cpu", dtype=dtype)
    res = measure_pair(str(chat_models.target), str(chat_models.draft), PROMPTS, s).to_dict()
    assert res["settings"]["dtype"] == dtype
    assert all(row["drafted"] > 0 for row in res["prompts"])
    # greedy output equals plain greedy in the same dtype (tiny random models: no near ties)
    _exact(chat_models.target, res["prompts"], dtype)


def test_non_llama_architecture_takes_the_plain_forward_and_stays_exact(
    chat_models, tmp_path: Path
):
    model = load_causal_lm(chat_models.gpt2)
    assert model.config.model_type == "gpt2" and not CachedLM(model)._fast
    draft = make_chat_model(tmp_path / "gpt2-draft", arch="gpt2", layers=1, seed=3,
                            from_model=chat_models.gpt2)  # fmt: skip
    s = MeasureSettings(method="draft_model", k=3, max_new_tokens=10, device="cpu")
    res = measure_pair(str(chat_models.gpt2), str(draft), PROMPTS, s).to_dict()
    assert sum(row["accepted"] for row in res["prompts"]) > 0
    _exact(chat_models.gpt2, res["prompts"])


def test_model_code_outside_transformers_is_refused_unless_approved(tmp_path: Path):
    custom = make_chat_model(tmp_path / "custom", layers=1)
    cfg = json.loads((custom / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "modeling_x.XConfig",
                       "AutoModelForCausalLM": "modeling_x.XForCausalLM"}  # fmt: skip
    cfg["model_type"] = "x-custom"
    (custom / "config.json").write_text(json.dumps(cfg))
    (custom / "modeling_x.py").write_text("raise SystemExit('must never run')\n")
    facts = read_model_facts(custom).to_dict()
    assert facts["remote_code"] is True
    assert read_model_facts(make_chat_model(tmp_path / "plain", layers=1)).remote_code is False
    parts = [("target", "acme/custom", facts, "ab" * 32)]
    refused, needed = remote_code_parts(parts, approved=set())
    assert needed and "acme/custom ships its own model code" in refused[0]
    assert remote_code_parts(parts, approved={"cd" * 32}) == (refused, True)  # other bytes
    assert remote_code_parts(parts, approved={"ab" * 32}) == ([], True)
    # A policy can no longer grant it by lineage name.
    with pytest.raises(Exception, match="approve-remote-code"):
        parse_policy('name = "p"\n[runner]\ntrust_remote_code = ["acme/custom"]')
    with pytest.raises(Exception, match="trust_remote_code"):
        parse_policy('name = "p"\n[runner]\ntrust_remote_code = "acme/custom"')
    with pytest.raises(ValueError, match=r"not in transformers .*approve-remote-code"):
        load_causal_lm(custom)
