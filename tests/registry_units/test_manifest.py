"""Content manifests: walking rules, digest definitions, parallel = serial, errors."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from registry.artifacts.manifest import (
    CHUNK_SIZE,
    Manifest,
    ManifestError,
    build_manifest,
    compare_manifests,
    hash_file,
    manifest_digest,
    model_signing_root,
)


def _tree(root: Path) -> Path:
    files = {
        "config.json": b'{"model_type": "llama"}',
        "model-00001.safetensors": os.urandom(3 * CHUNK_SIZE + 17),
        "model-00002.safetensors": os.urandom(CHUNK_SIZE),
        "empty.txt": b"",
        "sub/dir/tokenizer.json": b"{}",
        "caf\u00e9/na\u00efve.txt": b"unicode path",
        ".gitattributes": b"*.safetensors filter=lfs",
        ".gitignore": b"*.pyc",
        ".git/HEAD": b"ref: refs/heads/main",
        ".github/workflows/ci.yml": b"on: push",
        "sub/.git/config": b"[core]",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def test_entries_skip_vcs_and_are_sorted(tmp_path: Path) -> None:
    m = build_manifest(_tree(tmp_path))
    paths = [e["path"] for e in m.entries]
    assert paths == sorted(paths)
    assert paths == [
        "caf\u00e9/na\u00efve.txt",
        "config.json",
        "empty.txt",
        "model-00001.safetensors",
        "model-00002.safetensors",
        "sub/dir/tokenizer.json",
    ]
    assert all(set(e) == {"path", "size", "sha256"} for e in m.entries)
    big = next(e for e in m.entries if e["path"] == "model-00001.safetensors")
    assert big["size"] == 3 * CHUNK_SIZE + 17
    data = (tmp_path / "model-00001.safetensors").read_bytes()
    assert big["sha256"] == hashlib.sha256(data).hexdigest()
    assert m.file_count == 6
    assert m.total_size == sum(e["size"] for e in m.entries)


def test_digests_recomputed_independently(tmp_path: Path) -> None:
    m = build_manifest(_tree(tmp_path))
    # Independent re-implementation of the documented definitions.
    entries = []
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        dirnames[:] = [d for d in dirnames if d not in {".git", ".github"}]
        for name in filenames:
            if name in {".gitattributes", ".gitignore"}:
                continue
            full = Path(dirpath) / name
            data = full.read_bytes()
            rel = full.relative_to(tmp_path).as_posix()
            entries.append(
                {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            )
    entries.sort(key=lambda e: e["path"])
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode("utf-8")
    assert m.digest == hashlib.sha256(canonical).hexdigest()
    root = hashlib.sha256(b"".join(bytes.fromhex(e["sha256"]) for e in entries)).hexdigest()
    assert m.signing_root == root
    assert manifest_digest(list(reversed(entries))) == m.digest
    assert model_signing_root(entries) == m.signing_root


def test_digest_binds_names_signing_root_does_not(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"weights")
    before = build_manifest(tmp_path)
    (tmp_path / "a.bin").rename(tmp_path / "b.bin")
    after = build_manifest(tmp_path)
    assert before.digest != after.digest
    assert before.signing_root == after.signing_root


def test_parallel_equals_serial(tmp_path: Path) -> None:
    _tree(tmp_path)
    for i in range(20):
        (tmp_path / f"shard-{i:02d}.bin").write_bytes(os.urandom(1000 + i * 5000))
    serial = build_manifest(tmp_path, workers=1)
    parallel = build_manifest(tmp_path, workers=4)
    assert serial == parallel


def test_symlink_inside_followed_outside_refused(tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    (root / "real.bin").write_bytes(b"content")
    (root / "alias.bin").symlink_to("real.bin")
    (root / "linkdir").symlink_to(root / "sub", target_is_directory=True)
    (root / "sub").mkdir()
    (root / "sub" / "x.txt").write_bytes(b"x")
    m = build_manifest(root)
    by_path = {e["path"]: e for e in m.entries}
    assert by_path["alias.bin"]["sha256"] == by_path["real.bin"]["sha256"]
    assert by_path["linkdir/x.txt"] == {**by_path["sub/x.txt"], "path": "linkdir/x.txt"}

    (tmp_path / "secret").write_bytes(b"outside")
    (root / "escape.bin").symlink_to(tmp_path / "secret")
    with pytest.raises(ManifestError, match="escape.bin") as info:
        build_manifest(root)
    assert "outside" in str(info.value)
    # ... unless the caller widens the allowed root (Hub cache snapshots link into blobs/).
    assert any(
        e["path"] == "escape.bin" for e in build_manifest(root, symlink_root=tmp_path).entries
    )


def test_symlink_cycle_and_dangling_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "loop").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ManifestError, match="cycle"):
        build_manifest(tmp_path)
    (tmp_path / "d" / "loop").unlink()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ManifestError, match="dangling"):
        build_manifest(tmp_path)


def test_missing_dir_not_dir_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="does not exist"):
        build_manifest(tmp_path / "nope")
    f = tmp_path / "file"
    f.write_bytes(b"x")
    with pytest.raises(ManifestError, match="not a directory"):
        build_manifest(f)
    # A file that disappears between listing and hashing is reported by path.
    with pytest.raises(ManifestError, match="gone.bin") as info:
        hash_file(tmp_path / "gone.bin")
    assert info.value.path and info.value.path.endswith("gone.bin")
    fifo = tmp_path / "fifo_dir"
    fifo.mkdir()
    os.mkfifo(fifo / "pipe")
    with pytest.raises(ManifestError, match="pipe"):
        build_manifest(fifo)
    if os.geteuid() == 0:
        pytest.skip("permission bits do not stop root")
    d = tmp_path / "d"
    d.mkdir()
    (d / "locked.bin").write_bytes(b"x")
    (d / "locked.bin").chmod(0)
    try:
        with pytest.raises(ManifestError, match="locked.bin") as info:
            build_manifest(d)
        assert info.value.path and info.value.path.endswith("locked.bin")
    finally:
        (d / "locked.bin").chmod(0o644)


def test_hash_file_git_blob_id(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"hello\n")
    fh = hash_file(p, git_blob_sha1=True)
    assert fh.git_sha1 == "ce013625030ba8dba906f756967f9e9ca394464a"  # `git hash-object`
    assert fh.size == 6


def test_compare_and_json(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1")
    (tmp_path / "b").write_bytes(b"2")
    expected = build_manifest(tmp_path)
    (tmp_path / "a").write_bytes(b"changed")
    (tmp_path / "b").unlink()
    (tmp_path / "c").write_bytes(b"3")
    diff = compare_manifests(expected, build_manifest(tmp_path))
    assert (diff.changed, diff.missing, diff.added) == (["a"], ["b"], ["c"])
    assert not diff.ok
    assert compare_manifests(expected, expected.entries).ok
    data = json.loads(expected.to_json())
    assert data["digest"] == expected.digest
    assert Manifest.from_entries(data["entries"]) == expected


def test_malformed_entries_rejected() -> None:
    with pytest.raises(ManifestError, match="sha256"):
        manifest_digest([{"path": "a", "size": 1, "sha256": "xyz"}])
    good = {"path": "a", "size": 1, "sha256": "0" * 64}
    with pytest.raises(ManifestError, match="duplicate"):
        manifest_digest([good, good])
    # Extra keys and string sizes do not change the digest.
    assert manifest_digest([{**good, "extra": 1, "size": "1"}]) == manifest_digest([good])
