"""Hub resolution against the loopback Hub, with the real huggingface_hub client and cache."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download, snapshot_download

from registry.artifacts import hub
from registry.artifacts.manifest import build_manifest
from tests.hubserver import HubServer

WEIGHTS = os.urandom(300_000)
FILES = {
    "config.json": json.dumps({"model_type": "llama", "hidden_size": 64}).encode(),
    "tokenizer.json": b'{"version": "1.0"}',
    "model.safetensors": WEIGHTS,
    "extra/notes.txt": b"notes",
    ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
}


def _get_paths(server: HubServer) -> list[str]:
    return [path for method, path in server.requests if method == "GET"]


def _blob(cache: Path, repo_id: str, commit: str, path: str) -> Path:
    link = hub.repo_cache_dir(repo_id, cache) / "snapshots" / commit / path
    return Path(os.path.realpath(link))


@pytest.mark.parametrize(
    "ref",
    [
        "acme/chat",
        "hf:/acme/chat",
        "hf://acme",
        "hf://acme/chat/extra",
        "hf://acme/chat@",
        "hf://acme/ch at",
        "hf:///chat",
        "hf://acme/-bad",
        "hf://acme/chat@../x",
    ],
)
def test_malformed_refs(ref: str) -> None:
    with pytest.raises(hub.HubRefError, match="expected hf://"):
        hub.parse_hf_ref(ref)


def test_parse_ok() -> None:
    assert hub.parse_hf_ref("hf://acme/chat-8b") == hub.HubRef("acme/chat-8b", None)
    ref = hub.parse_hf_ref("hf://acme/chat_8b.v2@refs/pr/1")
    assert (ref.repo_id, ref.revision, str(ref)) == (
        "acme/chat_8b.v2",
        "refs/pr/1",
        "hf://acme/chat_8b.v2@refs/pr/1",
    )


def test_resolve_branch_to_commit_uses_lfs_sha(hub_server: HubServer) -> None:
    commit = hub_server.add_repo("acme/draft", FILES)
    r = hub.resolve("hf://acme/draft", endpoint=hub_server.endpoint, cache_dir=hub_server.cache_dir)
    assert r.commit == commit and len(commit) == 40
    assert r.uri == f"hf://acme/draft@{commit}" and r.requested_revision is None
    by_path = {e["path"]: e for e in r.entries}
    assert ".gitattributes" not in by_path
    import hashlib

    assert by_path["model.safetensors"] == {
        "path": "model.safetensors",
        "size": len(WEIGHTS),
        "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
    }
    # Weights were not downloaded: their sha256 came from the Hub's LFS metadata.
    assert not any(p.endswith("/model.safetensors") for p in _get_paths(hub_server))
    assert r.verified_paths == {"config.json", "tokenizer.json", "extra/notes.txt"}
    assert not r.complete_snapshot and r.lfs_paths == {"model.safetensors"}
    assert r.snapshot_dir is not None and (r.snapshot_dir / "config.json").is_file()

    # The full download gives the same manifest, now every file verified locally, and it
    # equals what build_manifest computes over the cache snapshot.
    full = hub.resolve(
        "hf://acme/draft@main",
        endpoint=hub_server.endpoint,
        cache_dir=hub_server.cache_dir,
        download="all",
    )
    assert full.complete_snapshot and full.verified_paths == set(by_path)
    assert full.manifest.digest == r.manifest.digest
    local = build_manifest(
        full.snapshot_dir, symlink_root=hub.repo_cache_dir("acme/draft", hub_server.cache_dir)
    )  # type: ignore[arg-type]
    assert local.digest == r.manifest.digest


def test_branch_move_and_branch_head(hub_server: HubServer) -> None:
    first = hub_server.add_repo("acme/target", FILES)
    assert hub.branch_head("hf://acme/target", endpoint=hub_server.endpoint) == first
    second = hub_server.update_branch("acme/target", {**FILES, "config.json": b'{"v": 2}'})
    assert second != first
    assert (
        hub.branch_head(hub.HubRef("acme/target", "main"), endpoint=hub_server.endpoint) == second
    )
    old = hub.resolve(
        f"hf://acme/target@{first}", endpoint=hub_server.endpoint, cache_dir=hub_server.cache_dir
    )
    new = hub.resolve(
        "hf://acme/target", endpoint=hub_server.endpoint, cache_dir=hub_server.cache_dir
    )
    assert (old.commit, new.commit) == (first, second)
    assert old.manifest.digest != new.manifest.digest


def test_cached_blob_corruption_detected(hub_server: HubServer) -> None:
    commit = hub_server.add_repo("acme/draft", FILES)
    cache = hub_server.cache_dir
    assert cache is not None
    # The real client fills the cache...
    snapshot_download(
        "acme/draft", revision="main", cache_dir=str(cache), endpoint=hub_server.endpoint
    )
    ok = hub.resolve("hf://acme/draft", endpoint=hub_server.endpoint, cache_dir=cache)
    assert ok.verified_paths == {
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "extra/notes.txt",
    }
    # ...then an LFS blob is corrupted on disk (same size, one flipped byte).
    blob = _blob(cache, "acme/draft", commit, "model.safetensors")
    data = bytearray(blob.read_bytes())
    data[1000] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(hub.HubIntegrityError, match="model.safetensors") as info:
        hub.resolve("hf://acme/draft", endpoint=hub_server.endpoint, cache_dir=cache)
    assert info.value.paths == ["model.safetensors"]
    assert "LFS sha256" in str(info.value)


def test_cached_git_file_corruption_detected(hub_server: HubServer) -> None:
    commit = hub_server.add_repo("acme/draft", FILES)
    cache = hub_server.cache_dir
    hf_hub_download(
        "acme/draft",
        "config.json",
        revision=commit,
        cache_dir=str(cache),
        endpoint=hub_server.endpoint,
    )
    _blob(cache, "acme/draft", commit, "config.json").write_bytes(b'{"model_type": "evil"}')  # type: ignore[arg-type]
    with pytest.raises(hub.HubIntegrityError, match="config.json: size"):
        hub.resolve(f"hf://acme/draft@{commit}", endpoint=hub_server.endpoint, cache_dir=cache)


def test_offline_from_cache(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = hub_server.add_repo("acme/draft", FILES)
    cache = hub_server.cache_dir
    assert cache is not None
    snapshot_download(
        "acme/draft", revision="main", cache_dir=str(cache), endpoint=hub_server.endpoint
    )
    online = hub.resolve("hf://acme/draft", endpoint=hub_server.endpoint, cache_dir=cache)

    # The client reads HF_HUB_OFFLINE into huggingface_hub.constants at import time;
    # resolve() reads both the environment and that constant at call time.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    seen = len(hub_server.requests)
    for ref in ("hf://acme/draft", f"hf://acme/draft@{commit}"):
        r = hub.resolve(ref, endpoint=hub_server.endpoint, cache_dir=cache)
        assert r.offline and r.commit == commit
        assert r.manifest.digest == online.manifest.digest
        assert r.verified_paths == online.verified_paths and r.complete_snapshot
    assert len(hub_server.requests) == seen, "offline resolve must not touch the network"

    with pytest.raises(hub.NotInCache, match="refs/dev"):
        hub.resolve("hf://acme/draft@dev", cache_dir=cache)
    with pytest.raises(hub.NotInCache, match="not in the cache"):
        hub.resolve("hf://acme/draft@" + "0" * 40, cache_dir=cache)
    with pytest.raises(hub.NotInCache):
        hub.resolve("hf://acme/other", cache_dir=cache)
    with pytest.raises(hub.NotInCache, match="offline"):
        hub.branch_head("hf://acme/draft", endpoint=hub_server.endpoint)

    # Corruption is still caught offline, from the cache's own content addresses.
    blob = _blob(cache, "acme/draft", commit, "model.safetensors")
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    with pytest.raises(hub.HubIntegrityError, match="model.safetensors"):
        hub.resolve("hf://acme/draft", cache_dir=cache)

    # An incomplete snapshot (file removed) is reported rather than silently hashed.
    (
        hub.repo_cache_dir("acme/draft", cache) / "snapshots" / commit / "extra" / "notes.txt"
    ).unlink()
    with pytest.raises(hub.NotInCache, match="incomplete"):
        hub.resolve("hf://acme/draft", cache_dir=cache)


def test_offline_after_small_resolve_uses_ref(
    hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = hub_server.add_repo("acme/cfg", {"config.json": b"{}", "README.md": b"# card"})
    hub.resolve("hf://acme/cfg@main", endpoint=hub_server.endpoint, cache_dir=hub_server.cache_dir)
    r = hub.resolve("hf://acme/cfg", cache_dir=hub_server.cache_dir, offline=True)
    assert r.commit == commit and [e["path"] for e in r.entries] == ["README.md", "config.json"]


def test_unknown_repo_and_revision(hub_server: HubServer) -> None:
    hub_server.add_repo("acme/draft", FILES)
    kw = {"endpoint": hub_server.endpoint, "cache_dir": hub_server.cache_dir}
    with pytest.raises(hub.RepoNotFound, match="acme/missing"):
        hub.resolve("hf://acme/missing", **kw)
    with pytest.raises(hub.RevisionNotFound, match="'v9'"):
        hub.resolve("hf://acme/draft@v9", **kw)
    with pytest.raises(hub.RevisionNotFound):
        hub.branch_head("hf://acme/draft@nope", endpoint=hub_server.endpoint)
    assert issubclass(hub.RepoNotFound, hub.HubError)


def test_unreachable_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(hub.HubUnreachable, match=f"127.0.0.1:{port}"):
        hub.resolve("hf://acme/draft", endpoint=f"http://127.0.0.1:{port}", cache_dir=tmp_path)
