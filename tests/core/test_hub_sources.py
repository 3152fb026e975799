"""``hf://`` sources through the service and CLI, against the loopback Hub."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.artifacts import hub
from registry.artifacts.manifest import build_manifest
from registry.errors import Conflict, InvalidInput, NotFound
from registry.services.artifacts import HubUnavailable, _hub_error
from tests.core.conftest import CliResult, audit_events, counts
from tests.core.test_pairs import ok, refused
from tests.fixtures import byte_tokenizer_json
from tests.hubserver import HubServer

WEIGHTS = bytes(range(256)) * 64


def repo_files(weights: bytes = WEIGHTS) -> dict[str, bytes]:
    config = {"model_type": "llama", "hidden_size": 64, "vocab_size": 258}
    return {
        "config.json": json.dumps(config).encode(),
        "tokenizer.json": json.dumps(byte_tokenizer_json()).encode(),
        "README.md": b"---\nlicense: mit\n---\n# card\n",
        ".gitattributes": b"*.safetensors filter=lfs\n",
        "model.safetensors": weights,
    }


def hf_add(cli: Callable[..., CliResult], ref: str, name: str = "acme/t") -> dict:
    return ok(cli("artifact", "add", ref, "--name", name, "--role", "target", "--json"))


def go_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_hub_branch_pinned_with_lfs_sha_and_moves(
    url: str, cli: Callable[..., CliResult], hub_server: HubServer, tmp_path: Path
) -> None:
    commit = hub_server.add_repo("org/repo", repo_files())
    first = hf_add(cli, "hf://org/repo@main")
    art = first["artifact"]
    assert art["source"] == f"hf://org/repo@{commit}"
    assert (art["hub_repo"], art["hub_revision"], art["hub_commit"]) == ("org/repo", "main", commit)
    assert art["source_kind"] == "hf" and art["local_path"] is None  # weights not downloaded
    entries = {e["path"]: e for e in art["manifest"]}
    assert set(entries) == {"config.json", "tokenizer.json", "README.md", "model.safetensors"}
    assert entries["model.safetensors"]["sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert entries["model.safetensors"]["size"] == len(WEIGHTS)
    downloads = [p for m, p in hub_server.requests if m == "GET" and "/resolve/" in p]
    assert not any(p.endswith("model.safetensors") for p in downloads)
    assert art["vocab_size"] == 258 and art["facts"]["hidden_size"] == 64

    # The same files on disk have the same manifest digest.
    local = tmp_path / "copy"
    local.mkdir()
    for name, data in repo_files().items():
        (local / name).write_bytes(data)
    assert build_manifest(local).digest == art["manifest_digest"]

    # The commit itself is the same artifact; a moved branch is a new version.
    before = counts(url)
    assert hf_add(cli, f"hf://org/repo@{commit}")["created"] is False
    assert counts(url) == before
    new_commit = hub_server.update_branch("org/repo", repo_files(WEIGHTS[::-1]))
    moved = hf_add(cli, "hf://org/repo")
    assert moved["created"] is True and moved["target_changed"] is True
    assert moved["artifact"]["version"] == 2 and moved["artifact"]["hub_commit"] == new_commit
    assert len(audit_events(url, "target.changed")) == 1


def test_hub_offline_from_cache_and_verify_snapshot(
    url: str,
    cli: Callable[..., CliResult],
    hub_server: HubServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from huggingface_hub import snapshot_download

    commit = hub_server.add_repo("org/full", repo_files())
    hub_server.add_repo("org/part", repo_files(b"partial weights"))
    snapshot_download(
        "org/full",
        revision="main",
        cache_dir=str(hub_server.cache_dir),
        endpoint=hub_server.endpoint,
    )
    full = hf_add(cli, "hf://org/full@main", "acme/full")["artifact"]
    snapshot = hub.repo_cache_dir("org/full", hub_server.cache_dir) / "snapshots" / commit
    assert full["local_path"] == str(snapshot)
    part = hf_add(cli, "hf://org/part@main", "acme/part")["artifact"]
    assert part["local_path"] is None

    # A complete Hub snapshot verifies (its files are symlinks into blobs/).
    assert ok(cli("artifact", "verify", "acme/full@v1", "--json"))["ok"] is True

    go_offline(monkeypatch)
    seen = len(hub_server.requests)
    before = counts(url)
    again = hf_add(cli, "hf://org/full@main", "acme/full")
    assert again["created"] is False and again["artifact"]["id"] == full["id"]
    partial = hf_add(cli, "hf://org/part", "acme/part")
    assert partial["created"] is False and partial["artifact"]["id"] == part["id"]
    assert counts(url) == before
    refused(
        url,
        lambda: cli("artifact", "add", "hf://org/part", "--name", "acme/other", "--role", "target"),
        "incomplete",
        "hf download",
    )
    refused(
        url,
        lambda: cli("artifact", "add", "hf://org/never", "--name", "acme/n", "--role", "target"),
        "offline",
    )
    assert len(hub_server.requests) == seen, "offline must not touch the network"

    # Corrupt a cached blob: verify lists it and exits 1.
    blob = (snapshot / "config.json").resolve()
    blob.write_bytes(b'{"tampered": true}')
    bad = cli("artifact", "verify", "acme/full@v1", "--json")
    assert bad.rc == 1 and bad.json()["changed"] == ["config.json"]


def test_hub_errors_one_line_nothing_written(
    url: str, cli: Callable[..., CliResult], hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_server.add_repo("org/repo", repo_files())
    for ref, needle in [
        ("hf://org/missing@main", "repository org/missing not found"),
        ("hf://org/repo@nope", "revision 'nope' not found"),
        ("hf://org/repo/extra", "namespace"),
        ("hf://org/re po", "whitespace"),
    ]:
        refused(
            url,
            lambda ref=ref: cli("artifact", "add", ref, "--name", "acme/t", "--role", "target"),
            needle,
        )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    refused(
        url,
        lambda: cli("artifact", "add", "hf://org/repo", "--name", "acme/t", "--role", "target"),
        "cannot reach",
    )


def test_hub_error_mapping() -> None:
    cases = [
        (hub.HubRefError("bad"), InvalidInput, 422),
        (hub.RepoNotFound("x"), NotFound, 404),
        (hub.RevisionNotFound("x"), NotFound, 404),
        (hub.EntryNotFound("x"), NotFound, 404),
        (hub.NotInCache("x"), NotFound, 404),
        (hub.HubIntegrityError("x", paths=["a.bin"]), Conflict, 409),
        (hub.HubUnreachable("x"), HubUnavailable, 422),
        (hub.HubError("x"), InvalidInput, 422),
    ]
    for exc, cls, status in cases:
        mapped = _hub_error(exc)
        assert type(mapped) is cls and mapped.status == status and mapped.field == "source"
    assert _hub_error(hub.HubIntegrityError("x", paths=["a.bin"])).details == {"paths": ["a.bin"]}
