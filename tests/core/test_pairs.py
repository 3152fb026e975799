"""Pairs: tokenizer equivalence, normalised config, digest, compatibility checks, lossy, list."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.core.conftest import CliResult, audit_events, counts
from tests.core.test_artifacts import add, doc_snippet
from tests.fixtures import byte_tokenizer_json, write_fake_model


def register(cli: Callable[..., CliResult], *args: str) -> CliResult:
    return cli("pair", "register", *args, "--json")


def ok(res: CliResult) -> dict:
    assert res.rc == 0, res.err
    return res.json()


def refused(url: str, res_fn: Callable[[], CliResult], *needles: str) -> str:
    """Run a command that must fail: exit 2, one stderr line containing needles, nothing written."""
    before = counts(url)
    res = res_fn()
    assert res.rc == 2, (res.out, res.err)
    assert res.out == "" and res.err.count("\n") == 1, res.err
    for needle in needles:
        assert needle in res.err, res.err
    assert counts(url) == before
    return res.err


def test_equivalent_tokenizers_same_vocab_digest_and_pair_accepted(
    url: str, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    target = write_fake_model(tmp_path / "t")
    draft = write_fake_model(tmp_path / "d", hidden_size=32, weights=b"d")
    # Same vocabulary, different bytes: indentation, key order.
    (draft / "tokenizer.json").write_text(
        json.dumps(byte_tokenizer_json(), indent=3, sort_keys=True)
    )
    t = add(cli, target, "acme/t", "target")["artifact"]
    d = add(cli, draft, "acme/d", "draft")["artifact"]
    assert (target / "tokenizer.json").read_bytes() != (draft / "tokenizer.json").read_bytes()
    assert t["tokenizer_digest"] != d["tokenizer_digest"]
    assert t["vocab_digest"] == d["vocab_digest"] and t["vocab_size"] == d["vocab_size"] == 258
    pair = ok(
        register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/d@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
        )
    )["pair"]
    assert pair["warnings"] == [] and pair["status"] == "registered"

    # A different vocabulary is refused for draft_model.
    other = write_fake_model(tmp_path / "o", hidden_size=32, weights=b"o")
    tok = byte_tokenizer_json()
    tok["model"]["vocab"]["<pad>"] = 258
    (other / "tokenizer.json").write_text(json.dumps(tok))
    o = add(cli, other, "acme/o", "draft")["artifact"]
    assert o["vocab_digest"] != t["vocab_digest"]
    refused(
        url,
        lambda: register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/o@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
        ),
        "vocabulary mismatch",
    )


def test_config_normalised_digest_recomputable_and_idempotent(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    add(cli, models["t1"], "acme/t", "target")
    add(cli, models["draft"], "acme/d", "draft")
    base = ("--target", "acme/t@v1", "--draft", "acme/d@v1", "--method", "draft_model", "--k", "4")
    first = ok(register(cli, *base, "--set", "engine=vllm", "--set", "engine_version=0.10"))
    pair = first["pair"]
    assert first["created"] is True
    assert pair["config"] == {
        "acceptance": "strict",
        "dtype": "float32",
        "engine": "vllm",
        "engine_version": "0.10",
        "method": "draft_model",
        "num_speculative_tokens": 4,
    }
    assert list(pair["config"]) == sorted(pair["config"])
    assert pair["lossy"] is False and pair["k"] == 4

    shown = cli("pair", "show", str(pair["id"]), "--json")
    proc = subprocess.run(
        [sys.executable, "-c", doc_snippet("pair-digest")],
        input=shown.out,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.split() == [pair["pair_digest"], "ok"]

    # Same intent, options in another order and defaults spelt out: the same pair.
    before = counts(url)
    again = ok(
        register(
            cli,
            *base,
            "--set",
            "engine_version=0.10",
            "--set",
            "dtype=float32",
            "--set",
            "engine=vllm",
            "--set",
            "acceptance=strict",
        )
    )
    assert again["created"] is False and again["pair"]["id"] == pair["id"]
    assert counts(url) == before
    events = audit_events(url, "pair.registered")
    assert len(events) == 1 and json.loads(events[0].payload)["pair_digest"] == pair["pair_digest"]

    # Any change of config is another pair.
    other = ok(
        register(cli, *base[:-1], "5", "--set", "engine=vllm", "--set", "engine_version=0.10")
    )
    assert other["created"] is True and other["pair"]["pair_digest"] != pair["pair_digest"]


def test_compatibility_checks(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    add(cli, models["t1"], "acme/t", "target")
    add(cli, models["t2"], "acme/t", "target")
    add(cli, models["draft"], "acme/d", "draft", "--trained-against", "acme/t@v1")
    add(cli, models["heads"], "acme/h", "heads")
    add(cli, models["heads_wide"], "acme/hw", "heads")
    narrow_vocab = write_fake_model(
        models["heads"].parent / "hv", vocab_size=300, weights=b"hv", tokenizer=False
    )
    add(cli, narrow_vocab, "acme/hv", "heads")

    heads = ok(
        register(
            cli, "--target", "acme/t@v1", "--draft", "acme/h@v1", "--method", "medusa", "--k", "3"
        )
    )["pair"]
    assert heads["warnings"] == [] and heads["drafter"]["facts"]["medusa_num_heads"] == 3
    refused(
        url,
        lambda: register(
            cli, "--target", "acme/t@v1", "--draft", "acme/hw@v1", "--method", "medusa", "--k", "3"
        ),
        "hidden size mismatch",
        "128",
        "64",
    )
    refused(
        url,
        lambda: register(
            cli, "--target", "acme/t@v1", "--draft", "acme/hv@v1", "--method", "eagle", "--k", "3"
        ),
        "vocabulary size mismatch",
        "300",
        "258",
    )
    refused(
        url,
        lambda: register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/d@v1",
            "--method",
            "prompt_lookup",
            "--k",
            "3",
        ),
        "prompt_lookup uses no drafter",
    )
    refused(
        url,
        lambda: register(cli, "--target", "acme/t@v1", "--method", "medusa", "--k", "3"),
        "needs a drafter",
    )
    refused(
        url,
        lambda: register(cli, "--target", "acme/d@v1", "--method", "prompt_lookup", "--k", "3"),
        "has role draft",
    )

    pl = ok(
        register(
            cli,
            "--target",
            "acme/t@v1",
            "--method",
            "prompt_lookup",
            "--k",
            "3",
            "--set",
            "prompt_lookup_max=4",
        )
    )["pair"]
    assert pl["drafter"] is None
    assert pl["config"]["prompt_lookup_max"] == 4 and pl["config"]["prompt_lookup_min"] == 1

    # The draft was trained against v1: v1 is clean, v2 is a warning, --strict an error.
    clean = ok(
        register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/d@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
        )
    )["pair"]
    assert clean["warnings"] == []
    refused(
        url,
        lambda: cli(
            "pair",
            "register",
            "--target",
            "acme/t@v2",
            "--draft",
            "acme/d@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
            "--strict",
        ),
        "(strict) drafter declares intended target",
    )
    moved = ok(
        register(
            cli,
            "--target",
            "acme/t@v2",
            "--draft",
            "acme/d@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
        )
    )["pair"]
    assert len(moved["warnings"]) == 1
    assert "declares intended target" in moved["warnings"][0]
    assert "acme/t@v2" in moved["warnings"][0]
    human = cli("pair", "show", moved["pair_digest"][:12])
    assert human.rc == 0 and "declares intended target" in human.out

    # A declaration in config.json naming another model is a warning too.
    named = write_fake_model(
        models["draft"].parent / "named",
        hidden_size=32,
        weights=b"n",
        config_extra={"base_model_name_or_path": "other/model"},
    )
    add(cli, named, "acme/named", "draft")
    res = ok(
        register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/named@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
        )
    )["pair"]
    assert res["warnings"] and "other/model" in res["warnings"][0]


def test_lossy_pairs_and_list_filters(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    add(cli, models["t1"], "acme/t", "target")
    add(cli, models["t2"], "acme/t", "target")
    add(cli, models["draft"], "acme/d", "draft")
    strict = ok(
        register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/d@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
        )
    )["pair"]
    lossy = ok(
        register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/d@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
            "--set",
            "acceptance=typical",
        )
    )["pair"]
    assert lossy["lossy"] is True and strict["lossy"] is False
    assert lossy["config"]["typical_epsilon"] == 0.09
    assert lossy["config"]["typical_delta"] == 0.3
    assert lossy["config"]["strict_prefix_tokens"] == 0
    refused(
        url,
        lambda: register(
            cli,
            "--target",
            "acme/t@v1",
            "--draft",
            "acme/d@v1",
            "--method",
            "draft_model",
            "--k",
            "4",
            "--set",
            "typical_epsilon=0.1",
        ),
        "unknown config key 'typical_epsilon'",
    )
    pl = ok(register(cli, "--target", "acme/t@v2", "--method", "prompt_lookup", "--k", "2"))["pair"]

    shown = cli("pair", "show", str(lossy["id"]))
    assert "LOSSY (typical)" in shown.out
    listing = cli("pair", "list")
    assert listing.rc == 0 and "LOSSY (typical)" in listing.out and "lossless" in listing.out

    def ids(*args: str) -> list[int]:
        return [p["id"] for p in ok(cli("pair", "list", "--json", *args))["items"]]

    assert ids() == [strict["id"], lossy["id"], pl["id"]]
    assert ids("--target", "acme/t@v1") == [strict["id"], lossy["id"]]
    assert ids("--target", "acme/t@latest") == [pl["id"]]
    assert ids("--method", "prompt_lookup") == [pl["id"]]
    assert ids("--status", "registered", "--method", "draft_model") == [strict["id"], lossy["id"]]
    assert ids("--status", "promoted") == []
    page = ok(cli("pair", "list", "--json", "--limit", "2"))
    assert len(page["items"]) == 2 and page["next_cursor"]
    assert [p["lossy"] for p in page["items"]] == [False, True]
    refused(url, lambda: cli("pair", "list", "--status", "bogus"), "status must be one of")
