from __future__ import annotations

import json

import pytest

from runner import (
    CATEGORIES,
    RUNNER_VERSION,
    MeasureSettings,
    Prompt,
    load_suite,
    log_measurement,
    measure_pair,
    suite_digest,
    summarize,
    theoretical_tau,
)
from runner.stats import speedup_estimate


@pytest.mark.parametrize("name", CATEGORIES)
def test_builtin_suites(name):
    s = load_suite(name)
    assert len(s.prompts) >= 10
    assert {p.category for p in s.prompts} == {name}
    assert all(len(p.prompt.encode()) <= 300 for p in s.prompts)
    assert s.digest == load_suite(name).digest == suite_digest(list(reversed(s.prompts)))
    chat = load_suite(f"chat:{name}")
    assert len(chat.prompts) == len(s.prompts)
    assert {p.category for p in chat.prompts} == {name}
    assert all(p.is_chat and p.messages[-1]["role"] == "user" for p in chat.prompts)
    assert chat.digest != s.digest


def test_default_suite_and_digest_definition():
    s = load_suite("default")
    assert set(s.categories) == set(CATEGORIES)
    items = sorted((p.to_dict() for p in s.prompts), key=lambda d: d["id"])
    import hashlib

    canon = json.dumps(items, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert s.digest == hashlib.sha256(canon.encode()).hexdigest()


def test_user_and_specbench_files(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"id": "a", "category": "code", "prompt": "def f("}\n\n')
    assert load_suite(str(f)).prompts == [Prompt("a", "code", "def f(")]
    sb = tmp_path / "question.jsonl"
    sb.write_text(
        json.dumps(
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]}
        )
        + "\n"
    )
    assert load_suite(str(sb)).prompts == [Prompt("81", "writing", "Write a poem.")]


@pytest.mark.parametrize(
    "content,msg",
    [
        ('{"id": "a", "category": "x"}\n', "line 1: missing field 'prompt'"),
        ('{"id": "a", "category": "x", "prompt": "p"}\nnot json\n', "line 2: invalid JSON"),
        ('{"question_id": 1, "turns": []}\n', "line 1: field 'turns'"),
        ('{"id": "a", "prompt": "p"}\n', "line 1: missing or empty field 'category'"),
        (
            '{"id":"a","category":"c","prompt":"p"}\n{"id":"a","category":"c","prompt":"q"}\n',
            "line 2: duplicate id",
        ),
    ],
)
def test_bad_files(tmp_path, content, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(ValueError, match=msg.replace("(", r"\(")):
        load_suite(str(f))
    with pytest.raises(ValueError, match="unknown suite"):
        load_suite("no-such-suite")


def test_formulas():
    assert theoretical_tau(0.8, 4) == pytest.approx(3.3616)
    assert theoretical_tau(1.0, 4) == 5.0
    assert speedup_estimate(0.8, 4, 0.0) == pytest.approx(3.3616)
    assert speedup_estimate(0.8, 4, 0.25) == pytest.approx(3.3616 / 2)


def _row(pid, cat, acc, rej, drafted):
    return {
        "id": pid,
        "category": cat,
        "target_calls": 1 + acc + rej,
        "prefill_calls": 1,
        "steps": acc + rej,
        "drafted": drafted,
        "accepted": acc,
        "rejections": rej,
        "emitted": 1 + 2 * acc + rej,
        "beta_sum": 0.0,
        "beta_count": 0,
        "accepted_per_position": [acc, 0],
        "verified_per_position": [acc + rej, 0],
        "draft_time_s": 0.1,
        "target_time_s": 0.2,
    }


def test_summarize_recomputes_from_rows():
    rows = [_row("a", "code", 8, 2, 20), _row("b", "code", 6, 4, 20), _row("c", "sql", 1, 9, 20)]
    out = summarize(rows, k=2)
    code = out["categories"]["code"]
    assert code["alpha"] == pytest.approx(14 / 20)
    assert code["draft_acceptance_rate"] == pytest.approx(14 / 40)
    lo, hi = code["alpha_ci"]
    assert 0.6 <= lo <= code["alpha"] <= hi <= 0.8
    assert out["overall"]["prompts"] == 3
    assert out["overall"]["expected_alpha"] is None
    assert summarize(rows, k=2) == out  # fixed bootstrap seed


def test_measure_result_shape_and_mlflow(tiny, tmp_path):
    prompts = load_suite("structured").prompts[:2]
    s = MeasureSettings(
        method="medusa",
        k=3,
        temperature=0.7,
        top_p=0.9,
        max_new_tokens=16,
        device="cpu",
        acceptance="typical",
        strict_prefix_tokens=4,
    )
    res = measure_pair(tiny.target_v1, tiny.medusa, prompts, s, suite_digest="abc")
    d = json.loads(json.dumps(res.to_dict()))
    assert d["lossy"] is True and d["suite_digest"] == "abc"
    assert d["runner_version"] == RUNNER_VERSION
    cat = d["categories"]["structured"]
    for key in (
        "alpha",
        "alpha_ci",
        "draft_acceptance_rate",
        "tau",
        "tau_theoretical",
        "expected_alpha",
        "per_position",
        "prompts",
        "counters",
    ):
        assert key in cat
    row = d["prompts"][0]
    assert len(row["accepted_per_position"]) == 3 and row["emitted"] == len(row["output_ids"])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = log_measurement(res, {"pair_digest": "deadbeef"}, tracking_uri=uri)
    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    assert run.data.params["pair_digest"] == "deadbeef"
    assert run.data.params["lossy"] == "True"
    assert "tau.structured" in run.data.metrics


def test_tiny_build_layout(tiny):
    from transformers import AutoConfig, AutoTokenizer

    from builders.tiny import is_built

    assert is_built(tiny.root)
    cfg = AutoConfig.from_pretrained(tiny.draft)
    assert cfg.speculators_config["verifier"]["name_or_path"] == "tiny/target-v1"
    tok = AutoTokenizer.from_pretrained(tiny.target_v2)
    assert tok("ab")["input_ids"] == [tok.bos_token_id, 97, 98]
    med = json.loads(open(f"{tiny.medusa}/config.json").read())
    assert med["medusa_num_heads"] == 3 and med["hidden_size"] == 256
