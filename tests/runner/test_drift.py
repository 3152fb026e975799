"""The drift scenario the tiny pairs exist for: the draft was trained for target-v1;
target-v2 (fine-tuned on prose) accepts fewer of its tokens on code."""

from __future__ import annotations

from runner import (
    MeasureSettings,
    greedy_continuations,
    load_suite,
    measure_pair,
    teacher_forced_overlap,
)


def test_alpha_drops_against_target_v2(tiny):
    prompts = load_suite("code").prompts[:8]
    s = MeasureSettings(method="draft_model", k=4, temperature=1.0, max_new_tokens=40, device="cpu")
    v1 = measure_pair(tiny.target_v1, tiny.draft, prompts, s).categories["code"]
    v2 = measure_pair(tiny.target_v2, tiny.draft, prompts, s).categories["code"]
    assert v2["alpha"] < v1["alpha"] - 0.08, (v1["alpha"], v2["alpha"])
    assert v2["expected_alpha"] < v1["expected_alpha"] - 0.05


def test_teacher_forced_overlap_shows_drift(tiny):
    prompts = load_suite("code").prompts[:6]
    items = greedy_continuations(tiny.target_v1, prompts, max_new_tokens=24, device="cpu")
    assert all(len(c) == 24 for _, c in items)
    d_v1 = teacher_forced_overlap(tiny.draft, tiny.target_v1, items, device="cpu")
    d_v2 = teacher_forced_overlap(tiny.draft, tiny.target_v2, items, device="cpu")
    same = teacher_forced_overlap(tiny.target_v1, tiny.target_v1, items, device="cpu")
    assert abs(same["mean"] - 1.0) < 1e-5
    assert d_v2["mean"] < d_v1["mean"] - 0.03
    assert len(d_v1["per_position"]) == 24 and len(d_v1["per_item"]) == 6
    # deterministic
    again = teacher_forced_overlap(tiny.draft, tiny.target_v2, items, device="cpu")
    assert again["mean"] == d_v2["mean"]
