from __future__ import annotations

from runner import MeasureSettings, Prompt, measure_pair
from runner.drafters import PromptLookupDrafter


def test_proposes_continuation_of_first_match():
    d = PromptLookupDrafter(max_ngram=3)
    toks = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # longest n-gram (1,2,3) first matches at index 0 -> continuation 9, 1, 2
    assert d.propose(toks, 3, None) == ([9, 1, 2], None)
    assert d.propose([5, 6, 7, 8], 4, None) == ([], None)  # nothing to copy
    assert d.propose([4, 5, 4], 4, None) == ([5, 4], None)  # falls back to n = 1


def test_copy_heavy_prompt_accepts_long_runs(tiny):
    block = "for i in range(10):\n    total = total + i\n"
    prompt = Prompt("copy", "code", block * 4 + "for i in")
    res = measure_pair(
        tiny.target_v1,
        None,
        [prompt],
        MeasureSettings(method="prompt_lookup", k=5, max_new_tokens=48, device="cpu"),
    )
    row = res.prompts[0]
    assert row["accepted"] > 0
    assert max(i for i, c in enumerate(row["accepted_per_position"]) if c) >= 2
    assert res.overall["tau"] > 1.5


def test_nothing_to_copy_falls_back_to_plain_steps(tiny):
    from runner import plain_greedy
    from runner.measure import encode_prompt
    from runner.models import load_tokenizer

    prompt = Prompt("uniq", "creative", "Qz")
    s = MeasureSettings(method="prompt_lookup", k=4, max_new_tokens=3, device="cpu")
    row = measure_pair(tiny.target_v1, None, [prompt], s).prompts[0]
    tok = load_tokenizer(tiny.target_v1)
    assert row["output_ids"] == plain_greedy(tiny.target_v1, encode_prompt(tok, "Qz"), 3)
    # every target call emitted exactly one token plus one per accepted draft
    assert row["emitted"] == row["target_calls"] + row["accepted"]
