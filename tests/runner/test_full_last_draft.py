"""``full_last_draft``: the runner counts the last steps as vLLM does (a full k drafted and
verified past the budget), emitting exactly the tokens it emits trimmed."""

from __future__ import annotations

import pytest

from runner import MeasureSettings, Prompt, measure_pair

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_full_last_draft_counts_past_the_budget(tiny, method: str) -> None:  # type: ignore[no-untyped-def]
    prompts = [Prompt("p1", "code", prompt="def add(a, b):"),
               Prompt("p2", "code", prompt="import os\n\nfor root, dirs, files in ")]  # fmt: skip
    drafter = tiny.draft if method == "draft_model" else tiny.eagle3
    base = {"method": method, "k": 4, "max_new_tokens": 30, "device": "cpu"}
    trimmed = measure_pair(tiny.target_v1, drafter, prompts, MeasureSettings(**base),
                           plain_baseline=False)  # fmt: skip
    settings = MeasureSettings(**base, full_last_draft=True)
    full = measure_pair(tiny.target_v1, drafter, prompts, settings, plain_baseline=False)
    for t, f in zip(trimmed.prompts, full.prompts, strict=True):
        assert f["output_ids"] == t["output_ids"] and len(f["output_ids"]) <= 30
        assert f["drafted"] == 4 * f["steps"]  # never a short draft
        assert t["drafted"] <= f["drafted"] and t["accepted"] <= f["accepted"]
        assert f["steps"] >= t["steps"]
        if len(t["output_ids"]) == 30:  # ran to the budget: at least one step drafted past it
            assert f["drafted"] > t["drafted"]
    assert full.settings["full_last_draft"] is True
    assert trimmed.settings["full_last_draft"] is False
