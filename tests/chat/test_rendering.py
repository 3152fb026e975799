"""Prompts rendered as served: raw text as the tokenizer encodes it, chats through the
target's own template, nothing prepended, the rendering recorded."""

from __future__ import annotations

import hashlib
import json

import pytest

from runner import MeasureSettings, measure_pair
from runner.executor import RunnerError, RunnerExecutor
from runner.measure import plain_greedy
from runner.models import eos_ids, load_causal_lm, load_tokenizer
from runner.render import (
    RenderError,
    encode_prompt,
    end_of_turn_ids,
    rendering_record,
)
from runner.suites import Prompt, load_suite, read_jsonl, suite_digest
from tests.chat.models import CHATML, END_OF_TEXT, IM_END, IM_START

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one?"},
]


def test_raw_prompt_is_encoded_as_the_tokenizer_does(chat_models):
    tok = load_tokenizer(chat_models.target)
    # this tokenizer (like SmolLM2's) adds nothing: no BOS may appear in front
    assert encode_prompt(tok, "hi") == tok("hi")["input_ids"] == [ord("h"), ord("i")]
    assert IM_START not in encode_prompt(tok, Prompt("r", "qa", prompt="hello"))


def test_tiny_tokenizer_keeps_its_own_bos():
    from builders.tiny import BOS_ID, make_tokenizer

    assert encode_prompt(make_tokenizer(), "ab") == [BOS_ID, ord("a"), ord("b")]


def test_chat_prompt_is_the_templates_rendering(chat_models):
    tok = load_tokenizer(chat_models.target)
    ids = encode_prompt(tok, Prompt("c", "multi_turn", messages=tuple(MESSAGES)))
    expected = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert ids == list(expected)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert text.endswith("<|im_start|>user\nAnother one?<|im_end|>\n<|im_start|>assistant\n")
    assert ids.count(IM_START) == 5 and ids.count(IM_END) == 4


def test_empty_prompt_without_bos_is_a_clear_error(chat_models):
    tok = load_tokenizer(chat_models.target)
    with pytest.raises(RenderError, match="adds no token"):
        encode_prompt(tok, "")


def test_chat_without_template_is_refused(chat_models):
    tok = load_tokenizer(chat_models.no_template)
    with pytest.raises(RenderError, match="no chat template"):
        encode_prompt(tok, MESSAGES)
    prompts = load_suite("chat:qa").prompts[:2]
    s = MeasureSettings(method="draft_model", k=2, max_new_tokens=4, device="cpu")
    with pytest.raises(ValueError, match="no chat template") as info:
        measure_pair(str(chat_models.no_template), str(chat_models.draft), prompts, s)
    assert "\n" not in str(info.value)


def test_stop_ids_include_the_templates_end_of_turn(chat_models):
    tok = load_tokenizer(chat_models.target)
    assert end_of_turn_ids(tok) == {IM_END}
    model = load_causal_lm(chat_models.target)
    assert eos_ids(model, tok) == {END_OF_TEXT, IM_END}
    assert end_of_turn_ids(load_tokenizer(chat_models.no_template)) == set()


def test_chat_measurement_is_exact_and_records_the_rendering(chat_models):
    prompts = load_suite("chat").prompts[::20][:4]
    assert {p.is_chat for p in prompts} == {True}
    s = MeasureSettings(method="draft_model", k=3, max_new_tokens=12, device="cpu")
    res = measure_pair(str(chat_models.target), str(chat_models.draft), prompts, s)
    d = res.to_dict()
    assert d["rendering"] == {
        "mode": "chat",
        "chat_template_digest": hashlib.sha256(CHATML.encode()).hexdigest(),
        "add_generation_prompt": True,
        "add_special_tokens": True,
    }
    tok = load_tokenizer(chat_models.target)
    model = load_causal_lm(chat_models.target)
    for p, row in zip(prompts, d["prompts"], strict=True):
        assert row["output_ids"] == plain_greedy(model, encode_prompt(tok, p), 12)
        assert row["drafted"] > 0


def test_rendering_modes():
    raw, chat = Prompt("a", "x", prompt="t"), Prompt("b", "x", messages=tuple(MESSAGES[1:2]))
    assert rendering_record(None, [raw])["mode"] == "raw"
    assert rendering_record(None, [raw])["chat_template_digest"] is None
    with pytest.raises(ValueError, match="exactly one"):
        Prompt("c", "x")
    assert [raw, chat] and {p.is_chat for p in (raw, chat)} == {False, True}


def test_user_jsonl_accepts_both_forms_and_digest_covers_messages(tmp_path):
    f = tmp_path / "mine.jsonl"
    lines = [
        {"id": "r", "category": "code", "prompt": "def f("},
        {"id": "c", "category": "multi_turn", "messages": MESSAGES},
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    prompts = read_jsonl(f)
    assert prompts[0] == Prompt("r", "code", prompt="def f(")
    assert prompts[1].messages == tuple(MESSAGES)
    changed = [dict(m) for m in MESSAGES]
    changed[1]["content"] = "Name a color."
    g = tmp_path / "changed.jsonl"
    g.write_text(json.dumps(lines[0]) + "\n" + json.dumps({**lines[1], "messages": changed}))
    assert suite_digest(read_jsonl(g)) != suite_digest(prompts)
    # the raw form's digest is unchanged by the chat support (same canonical items)
    assert prompts[0].to_dict() == lines[0]


@pytest.mark.parametrize(
    "obj,msg",
    [
        ({"id": "a", "category": "x", "prompt": "p", "messages": []}, "only one of"),
        ({"id": "a", "category": "x", "messages": []}, "non-empty list"),
        ({"id": "a", "category": "x", "messages": [{"role": "bot", "content": "h"}]}, ".role"),
        ({"id": "a", "category": "x", "messages": [{"role": "user"}]}, ".content"),
        ({"id": "a", "category": "x", "messages": [MESSAGES[2]]}, "assistant's"),
    ],
)
def test_bad_chat_lines(tmp_path, obj, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(obj) + "\n")
    with pytest.raises(ValueError, match=msg):
        read_jsonl(f)


def test_executor_refuses_chat_suite_on_template_less_target(chat_models):
    from registry.jobloop import MeasureTask

    task = MeasureTask(
        pair_digest="ab" * 32, lossy=False,
        settings={"method": "prompt_lookup", "k": 2, "max_new_tokens": 4},
        suite_name="chat:qa", categories=None, prompts_per_category=2,
        target_dir=str(chat_models.no_template), drafter_dir=None, device="cpu",
    )  # fmt: skip
    with pytest.raises(RunnerError, match="no chat template"):
        RunnerExecutor(log_runs=False).measure(task)


def test_mlflow_run_records_the_rendering(chat_models, tmp_path):
    from mlflow.tracking import MlflowClient

    from runner import log_measurement

    prompts = load_suite("chat:qa").prompts[:1]
    s = MeasureSettings(method="prompt_lookup", k=2, max_new_tokens=4, device="cpu")
    res = measure_pair(str(chat_models.target), None, prompts, s)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = log_measurement(res, {"pair_digest": "x"}, tracking_uri=uri)
    params = MlflowClient(tracking_uri=uri).get_run(run_id).data.params
    assert params["rendering.mode"] == "chat"
    assert params["rendering.chat_template_digest"] == hashlib.sha256(CHATML.encode()).hexdigest()
