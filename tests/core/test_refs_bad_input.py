"""References in every form, and bad input: exit 2, one stderr line, nothing written."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import update

from registry.db import session_scope
from registry.settings import Settings
from registry.tables import Artifact, Pair
from tests.core.conftest import CliResult
from tests.core.test_artifacts import add
from tests.core.test_pairs import ok, refused
from tests.fixtures import write_fake_model


def test_artifact_and_pair_references(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    v1 = add(cli, models["t1"], "acme/t", "target")["artifact"]
    v2 = add(cli, models["t2"], "acme/t", "target")["artifact"]
    for ref, want in [
        (str(v1["id"]), v1),
        (v1["manifest_digest"][:12], v1),
        (v2["manifest_digest"], v2),
        (v2["manifest_digest"][:40].upper(), v2),
        ("acme/t@v1", v1),
        ("acme/t@latest", v2),
    ]:
        got = ok(cli("artifact", "show", ref, "--json"))
        assert got["id"] == want["id"], ref
    pair = ok(
        cli(
            "pair",
            "register",
            "--target",
            v1["manifest_digest"][:14],
            "--method",
            "prompt_lookup",
            "--k",
            "2",
            "--json",
        )
    )["pair"]
    assert pair["target"]["id"] == v1["id"]
    for ref in (str(pair["id"]), pair["pair_digest"][:12], pair["pair_digest"]):
        assert ok(cli("pair", "show", ref, "--json"))["id"] == pair["id"]

    refused(url, lambda: cli("artifact", "show", "abc123"), "not a valid reference", "12 hex")
    refused(url, lambda: cli("artifact", "show", v1["manifest_digest"][:11]), "not a valid")
    refused(url, lambda: cli("artifact", "show", "zz" * 8), "not a valid reference")
    refused(url, lambda: cli("artifact", "show", "acme/t@v7"), "no artifact acme/t@v7")
    refused(url, lambda: cli("artifact", "show", "nope/x@latest"), "no artifact in lineage")
    refused(url, lambda: cli("artifact", "show", "999"), "no artifact with id 999")
    refused(url, lambda: cli("artifact", "show", "f" * 12), "no artifact with digest prefix")
    refused(url, lambda: cli("pair", "show", "acme/t@v1"), "not a valid pair reference")

    # Ambiguous prefixes: make a second record share the first 12 hex characters.
    prefix = v1["manifest_digest"][:12]
    with session_scope(url) as s:
        s.execute(
            update(Artifact)
            .where(Artifact.id == v2["id"])
            .values(manifest_digest=prefix + "0" * 52)
        )
    refused(url, lambda: cli("artifact", "show", prefix), "ambiguous")
    refused(
        url,
        lambda: cli(
            "pair", "register", "--target", prefix, "--method", "prompt_lookup", "--k", "3"
        ),
        "ambiguous",
    )
    assert ok(cli("artifact", "show", v1["manifest_digest"][:13], "--json"))["id"] == v1["id"]
    other = ok(
        cli(
            "pair",
            "register",
            "--target",
            "acme/t@v1",
            "--method",
            "prompt_lookup",
            "--k",
            "3",
            "--json",
        )
    )["pair"]
    with session_scope(url) as s:
        s.execute(
            update(Pair)
            .where(Pair.id == other["id"])
            .values(pair_digest=pair["pair_digest"][:12] + "0" * 52)
        )
    refused(url, lambda: cli("pair", "show", pair["pair_digest"][:12]), "ambiguous")


@pytest.fixture
def bad_sources(tmp_path: Path) -> dict[str, str]:
    with_fifo = write_fake_model(tmp_path / "fifo")
    os.mkfifo(with_fifo / "pipe")
    dangling = write_fake_model(tmp_path / "dangling")
    (dangling / "weights.bin").symlink_to(tmp_path / "gone.bin")
    outside = write_fake_model(tmp_path / "outside")
    (tmp_path / "secret").write_text("not model content")
    (outside / "leak").symlink_to(tmp_path / "secret")
    bad_json = write_fake_model(tmp_path / "badjson")
    (bad_json / "config.json").write_text("{not json")
    bad_tok = write_fake_model(tmp_path / "badtok")
    (bad_tok / "tokenizer.json").write_text("[1, 2]")
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "plain.txt").write_text("x")
    return {
        "missing": str(tmp_path / "nope"),
        "fifo": str(with_fifo),
        "dangling": str(dangling),
        "outside": str(outside),
        "bad_json": str(bad_json),
        "bad_tok": str(bad_tok),
        "empty": str(empty),
        "file": str(tmp_path / "plain.txt"),
        "scheme": "s3://bucket/model",
        "hf_malformed": "hf://just-a-name",
        "hf_empty_rev": "hf://org/name@",
    }


BAD_SOURCES = {
    "missing": "does not exist",
    "fifo": "not a regular file",
    "dangling": "dangling",
    "outside": "points outside",
    "bad_json": "config.json is not valid JSON",
    "bad_tok": "tokenizer.json",
    "empty": "contains no files",
    "file": "is not a directory",
    "scheme": "only local directories and hf://",
    "hf_malformed": "namespace",
    "hf_empty_rev": "empty revision",
}


def test_bad_sources_exit_2_and_write_nothing(
    home: Settings, cli: Callable[..., CliResult], bad_sources: dict[str, str]
) -> None:
    for key, needle in BAD_SOURCES.items():
        refused(
            home.db_url,
            lambda key=key: cli(
                "artifact", "add", bad_sources[key], "--name", "acme/x", "--role", "target"
            ),
            needle,
        )


def test_bad_options_exit_2_and_write_nothing(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    add(cli, models["t1"], "acme/t", "target")
    m = str(models["t2"])
    cases = [
        (("artifact", "add", m, "--name", "acme/t", "--role", "tokenizer"), "role must be one of"),
        (("artifact", "add", m, "--name", "has space", "--role", "target"), "no spaces"),
        (("artifact", "add", m, "--name", "a@b", "--role", "target"), "no spaces or '@'"),
        (
            ("artifact", "add", m, "--name", "x/y", "--role", "target", "--attestation", "noeq"),
            "expected key=value",
        ),
        (
            ("pair", "register", "--target", "acme/t@v1", "--method", "beam", "--k", "3"),
            "method must be one of",
        ),
        (
            ("pair", "register", "--target", "acme/t@v1", "--method", "prompt_lookup", "--k", "0"),
            "k must be at least 1",
        ),
        (
            (
                "pair",
                "register",
                "--target",
                "acme/t@v1",
                "--method",
                "prompt_lookup",
                "--k",
                "2",
                "--set",
                "colour=blue",
            ),
            "unknown config key 'colour'",
        ),
        (
            (
                "pair",
                "register",
                "--target",
                "acme/t@v1",
                "--method",
                "prompt_lookup",
                "--k",
                "2",
                "--set",
                "prompt_lookup_min=5",
            ),
            "prompt_lookup_min must not exceed",
        ),
        (
            (
                "pair",
                "register",
                "--target",
                "acme/t@v1",
                "--method",
                "prompt_lookup",
                "--k",
                "2",
                "--set",
                "dtype=int4",
            ),
            "dtype must be one of",
        ),
        (
            (
                "pair",
                "register",
                "--target",
                "acme/t@v1",
                "--method",
                "prompt_lookup",
                "--k",
                "2",
                "--set",
                "nokey",
            ),
            "expected key=value",
        ),
        (
            (
                "pair",
                "register",
                "--target",
                "acme/t@v1",
                "--method",
                "prompt_lookup",
                "--k",
                "2",
                "--set",
                "acceptance=greedy",
            ),
            "acceptance must be one of",
        ),
        (
            ("pair", "register", "--target", "abcdef", "--method", "prompt_lookup", "--k", "2"),
            "not a valid reference",
        ),
        (("artifact", "verify", "acme/t@v1", "--path", m + "/nope"), "is not a directory"),
        (("artifact", "list", "--role", "tokenizer"), "role must be one of"),
        (("pair", "list", "--method", "beam"), "method must be one of"),
    ]
    for args, needle in cases:
        refused(url, lambda args=args: cli(*args), needle)
