"""Speculate only where it pays: acceptance length per k from one measurement, the best k per
batch size on two hardware profiles, and the schedule carried into vLLM's speculative
config in the shape vLLM validates."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from registry.db import session_scope
from registry.economics import model as em
from registry.economics import schedule as ks
from registry.errors import InvalidInput
from registry.services import artifacts, economics, exports, measurements, pairs
from registry.tables import Artifact
from tests.economics.helpers import LLAMA3_8B
from tests.fixtures import write_fake_model
from tests.requests.conftest import promote_at

ACTOR = "tester"
# A measurement at k=4: accepted at position i / drafting steps, and given reached.
PER_POSITION = [0.78, 0.6, 0.45, 0.33]
CONDITIONAL = [0.78, 0.77, 0.75, 0.73]


def header_only_safetensors(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors header declaring ``tensors`` (the economics read headers only)."""
    size = {"BF16": 2, "F32": 4}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _llama(tmp: Path, name: str, layers: int, hidden: int, kv_heads: int) -> Path:
    per_layer = 12 * hidden * hidden
    cfg = {**LLAMA3_8B, "hidden_size": hidden, "num_hidden_layers": layers,
           "num_attention_heads": hidden // 128, "num_key_value_heads": kv_heads,
           "vocab_size": 258}  # fmt: skip
    return write_fake_model(
        tmp / name,
        hidden_size=hidden,
        weights=header_only_safetensors(
            {"layers": ("BF16", [layers, per_layer]), "embed": ("BF16", [128256, hidden])}
        ),
        config_extra=cfg,
    )


def _pair(url: str, tmp: Path, k: int = 4) -> str:
    """An 8B-shaped target with a 1B-shaped draft model, measured at k (synthetic rates)."""
    with session_scope(url) as s:
        t = artifacts.add_artifact(
            s, source=str(_llama(tmp, "t", 32, 4096, 8)), name="acme/t", role="target", actor=ACTOR
        ).artifact.id
        d = artifacts.add_artifact(
            s, source=str(_llama(tmp, "d", 16, 2048, 8)), name="acme/d", role="draft", actor=ACTOR
        ).artifact.id
        digest = pairs.register_pair(
            s, target=str(t), draft=str(d), method="draft_model", k=k,
            options={"dtype": "bfloat16"}, actor=ACTOR,
        ).pair.pair_digest  # fmt: skip
    per_pos = PER_POSITION[:k]
    cond = CONDITIONAL[:k]
    result = {
        "categories": {"code": {"alpha": 0.8, "per_position": [0.9, 0.8], "prompts": 1}},
        "overall": {"alpha": 0.77, "tau": 1 + sum(per_pos), "per_position": per_pos,
                    "per_position_conditional": cond, "prompts": 1},
        "prompts": [{"id": "p", "category": "code", "accepted": 3, "rejections": 1,
                     "drafted": 4, "output_ids": [1]}],
        "hardware": {"device": "cpu"},
    }  # fmt: skip
    with session_scope(url) as s:
        measurements.store_measurement(
            s, pair=digest, suite_name="tiny", suite_digest="s" * 64, settings={"k": k},
            runner_version="test-1", result=result, actor=ACTOR,
        )  # fmt: skip
    return digest


def test_acceptance_length_per_k_is_exact_up_to_the_measured_k() -> None:
    got = ks.acceptance_lengths(PER_POSITION, CONDITIONAL, 8)
    assert [a.k for a in got] == list(range(9))
    assert got[0].length == 1.0 and got[0].source == "plain"
    assert got[2].length == pytest.approx(1 + 0.78 + 0.6) and got[2].source == "measured"
    assert got[4].length == pytest.approx(1 + sum(PER_POSITION))
    # beyond k=4: each further position kept with the last conditional rate (0.73)
    assert got[5].source == "extrapolated"
    assert got[5].length - got[4].length == pytest.approx(0.33 * 0.73)
    assert got[6].length - got[5].length == pytest.approx(0.33 * 0.73**2)
    lengths = [a.length for a in got]
    assert lengths == sorted(lengths)


def test_choose_picks_the_best_k_and_merges_runs() -> None:
    def thr(b: int, k: int) -> float:  # speculation pays less as b grows; k=2 best early
        return {0: 10.0, 1: 30.0 - b, 2: 32.0 - 2 * b}[k]

    ranges = ks.choose(thr, [1, 2], 30)
    # b=2: k=2 and k=1 both give 28, b=20: k=1 and k=0 both give 10: ties go to the
    # shorter draft (the same predicted output for less work)
    assert ks.vllm_schedule(ranges) == [[1, 1, 2], [2, 19, 1], [20, 30, 0]]
    assert ranges[1].tokens_per_s == (28.0, 11.0) and ranges[1].plain_tokens_per_s == (10.0, 10.0)
    assert ks.trtllm_draft_len_schedule(ranges) == {1: 2, 2: 1, 20: 0}
    assert ks.choose(thr, [1, 2], 0) == []


def _vllm_accepts(schedule: list[list[int]], num_speculative_tokens: int) -> None:
    """vLLM's own rules for the 3-item form (vllm/v1/spec_decode/dynamic/utils.py):
    positive inclusive ranges, sorted, non-overlapping, the first starting at 1, k >= 0;
    num_speculative_tokens > 0 caps every k."""
    assert schedule and all(len(e) == 3 for e in schedule)
    assert schedule[0][0] == 1
    prev_end = 0
    for lo, hi, k in schedule:
        assert 0 < lo <= hi and lo > prev_end and k >= 0
        assert lo == prev_end + 1  # ours leave no gaps
        prev_end = hi
    assert num_speculative_tokens > 0
    assert max(k for *_, k in schedule) <= num_speculative_tokens


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_schedule_on_two_profiles(db_url: str, tmp_path: Path) -> None:
    digest = _pair(db_url, tmp_path)
    out: dict[str, Any] = {}
    for hw in ("h100-sxm", "a100-80gb"):
        with session_scope(db_url) as s:
            r = economics.k_schedule(s, pair=digest, hardware=hw, context=512, max_batch=512)
        out[hw] = r
        _vllm_accepts(
            r.vllm["num_speculative_tokens_per_batch_size"], r.vllm["num_speculative_tokens"]
        )
        assert r.ranges[-1].end_bs == r.max_batch
        # k never grows with the batch: verification only gets dearer
        seq = [g.k for g in r.ranges]
        assert seq == sorted(seq, reverse=True)
        # the chosen k beats every other k at each range's ends (the model, recomputed)
        lengths = {a.k: a.length for a in r.acceptance}
        with session_scope(db_url) as s:
            from registry.refs import resolve_pair

            p = resolve_pair(s, digest)
            tgt, _, _ = economics._part(p.target, "target", "bfloat16", 512)
            drf, _, _ = economics._part(p.drafter, "drafter", "bfloat16", 512)  # type: ignore[arg-type]
        prof = economics.hw_mod.get_profile(hw)  # shipped profiles

        def thr(b: int, k: int, parts: Any = (tgt, drf, prof, lengths)) -> float:
            t, d, hw_prof, al = parts
            shape = em.shape_for("draft_model", max(k, 1), al[k] if k else 1.0)
            pt = em.point(t, d, shape, hw_prof, "bfloat16", batch=b, context=512, price=None)
            return float((pt.plain_tokens_per_s if k == 0 else pt.spec_tokens_per_s) or 0)

        for g in r.ranges:
            for b in (g.start_bs, g.end_bs):
                assert thr(b, g.k) >= max(thr(b, k) for k in range(9)) - 1e-9
            assert g.tokens_per_s[0] == pytest.approx(thr(g.start_bs, g.k))
            assert g.gain_over_fixed_k[0] == pytest.approx(
                thr(g.start_bs, g.k) / thr(g.start_bs, 4)
            )
        assert r.mean_gain_over_fixed_k >= 1.0
        assert r.trtllm["draft_len_schedule"] == {g.start_bs: g.k for g in r.ranges}
        assert r.sglang is None
        assert any("extrapolated" in n for n in r.notes)
    # on the A100 speculation stops paying inside 512 sequences (k=0 from there on); the
    # H100's higher FLOPS per byte of bandwidth keeps it paying longer, so it never switches
    # off earlier than on the A100
    a100, h100 = out["a100-80gb"], out["h100-sxm"]
    assert a100.ranges[-1].k == 0 and a100.ranges[0].k == 4 == h100.ranges[0].k
    first_off = {
        hw: next((g.start_bs for g in r.ranges if g.k == 0), None) for hw, r in out.items()
    }
    assert first_off["h100-sxm"] is None or first_off["h100-sxm"] >= first_off["a100-80gb"]
    assert a100.mean_gain_over_fixed_k > 1.05  # switching off where it loses pays
    print(json.dumps({hw: {"schedule": r.vllm["num_speculative_tokens_per_batch_size"],
                            "gain_over_fixed_k": round(r.mean_gain_over_fixed_k, 4)}
                      for hw, r in out.items()}))  # fmt: skip


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_export_vllm_carries_the_schedule(db_url: str, tmp_path: Path) -> None:
    from datetime import UTC, datetime

    digest = _pair(db_url, tmp_path)
    promote_at(db_url, "chat-prod", digest, datetime.now(UTC))
    with session_scope(db_url) as s:
        for lineage, commit in (("acme/t", "a" * 40), ("acme/d", "b" * 40)):
            s.execute(
                update(Artifact).where(Artifact.lineage == lineage).values(
                    source_kind="hf", hub_repo=lineage, hub_commit=commit,
                    source=f"hf://{lineage}@{commit}",
                )
            )  # fmt: skip
    with session_scope(db_url) as s:
        plain = exports.export_serving(s, deployment="chat-prod", engine="vllm")
        v = exports.export_serving(
            s,
            deployment="chat-prod",
            engine="vllm",
            hardware="a100-80gb",
            context=512,
            max_batch=512,
        )
        g = exports.export_serving(s, deployment="chat-prod", engine="sglang", hardware="l4")
    assert plain.k_schedule is None and "num_speculative_tokens_per_batch_size" not in (
        plain.speculative_config or {}
    )
    spec = json.loads(v.args[v.args.index("--speculative-config") + 1])
    assert spec == v.speculative_config
    assert spec["num_speculative_tokens"] == 4  # the registered k: the schedule only lowers it
    sched = spec["num_speculative_tokens_per_batch_size"]
    assert (
        v.k_schedule is not None
        and sched == v.k_schedule.vllm["num_speculative_tokens_per_batch_size"]
    )
    _vllm_accepts(sched, spec["num_speculative_tokens"])
    assert max(k for *_, k in sched) == 4 and sched[-1][1] == 512 and sched[-1][2] == 0
    assert g.k_schedule is not None and any("SGLang has no" in n for n in g.k_schedule.notes)
    assert "num_speculative_tokens_per_batch_size" not in " ".join(g.args)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_schedule_refusals(db_url: str, tmp_path: Path) -> None:
    digest = _pair(db_url, tmp_path)
    with session_scope(db_url) as s:
        with pytest.raises(InvalidInput) as e:
            economics.k_schedule(s, pair=digest, hardware="l4", k_max=2)
        assert e.value.field == "k_max"
        with pytest.raises(InvalidInput) as e:
            economics.k_schedule(s, pair=digest, hardware="l4", category="nope")
        assert e.value.field == "category"
        by_cat = economics.k_schedule(s, pair=digest, hardware="l4", category="code", max_batch=8)
        assert [a.length for a in by_cat.acceptance][:3] == pytest.approx([1.0, 1.9, 2.7])
