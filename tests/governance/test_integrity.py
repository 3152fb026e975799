"""Only verified bytes run: every load goes through materialisation against the manifest.

Unit level: the stat cache (a second load re-hashes nothing, a changed file is re-hashed and
named, an added file is refused, ``full`` re-hashes everything) and Hub snapshots fetched
from the configured endpoint into the configured cache. End to end: a weight file edited
after registration fails the measurement job at once (no retry), names the file, and opens
an integrity flag that blocks promotion.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from api.backend import local_backend
from registry.artifacts.materialize import IntegrityError, materialise
from registry.records.core import ArtifactRecord
from tests.core.test_hub_sources import repo_files
from tests.fixtures import write_fake_model
from tests.hubserver import HubServer


def _record(home: Any, path: Path, name: str) -> ArtifactRecord:
    backend = local_backend(home)
    added = backend.add_artifact(source=str(path), name=name, role="target")
    return backend.get_artifact(ref=added.artifact.ref)


def _touch_same_size(path: Path, content: bytes) -> None:
    st = path.stat()
    assert len(content) == st.st_size
    path.write_bytes(content)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_stat_cache_rehashes_only_what_changed(home: Any, tmp_path: Path) -> None:
    model = write_fake_model(tmp_path / "m", weights=b"w" * 4096)
    art = _record(home, model, "acme/m")
    state = tmp_path / "verified"
    first = materialise(art, state_dir=state)
    assert first.path == model and first.rehashed == first.files == 3
    assert materialise(art, state_dir=state).rehashed == 0  # stat unchanged: trusted
    assert materialise(art, state_dir=state, full=True).rehashed == 3  # on demand: all

    _touch_same_size(model / "model.safetensors", b"x" * 4096)
    with pytest.raises(IntegrityError, match="changed model.safetensors") as caught:
        materialise(art, state_dir=state)
    assert caught.value.report.changed == ["model.safetensors"]

    _touch_same_size(model / "model.safetensors", b"w" * 4096)  # restored: verifies again
    assert materialise(art, state_dir=state).rehashed == 1
    (model / "extra.safetensors").write_bytes(b"smuggled")
    with pytest.raises(IntegrityError, match="added extra.safetensors"):
        materialise(art, state_dir=state)


def test_a_record_without_a_manifest_is_refused(tmp_path: Path) -> None:
    art = ArtifactRecord.model_construct(
        id=1, ref="a/b@v1", manifest=None, manifest_digest="0" * 64, local_path=str(tmp_path),
        source_kind="local",
    )  # fmt: skip
    from registry.errors import InvalidInput

    with pytest.raises(InvalidInput, match="no manifest"):
        materialise(art, state_dir=None)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_hub_snapshot_is_fetched_from_the_configured_endpoint_and_verified(
    home: Any, hub_server: HubServer, tmp_path: Path
) -> None:
    commit = hub_server.add_repo("org/repo", repo_files())
    backend = local_backend(home)
    art = backend.add_artifact(source="hf://org/repo@main", name="org/repo", role="target")
    record = backend.get_artifact(ref=art.artifact.ref)
    assert record.local_path is None  # registration hashed remotely, downloaded nothing
    cache = tmp_path / "worker-cache"
    got = materialise(record, state_dir=tmp_path / "v", cache_dir=cache)
    assert got.path == cache / "models--org--repo" / "snapshots" / commit
    assert got.rehashed == len(record.manifest or []) == 4
    assert any("/resolve/" in p for m, p in hub_server.requests if m == "GET")

    # A corrupted cache blob (the snapshot files are links into blobs/) is caught.
    blob = (got.path / "model.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    with pytest.raises(IntegrityError, match="model.safetensors"):
        materialise(record, state_dir=tmp_path / "v", cache_dir=cache)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_partial_hub_snapshot_is_completed_before_it_is_verified(
    home: Any, hub_server: HubServer, tmp_path: Path
) -> None:
    """A snapshot holding only the small files (what a tokenizer or config read leaves in
    the cache) is completed from the Hub, not failed as 'missing model.safetensors'."""
    from huggingface_hub import hf_hub_download

    from registry.artifacts.hub import default_endpoint

    commit = hub_server.add_repo("org/partial", repo_files())
    backend = local_backend(home)
    art = backend.add_artifact(source="hf://org/partial@main", name="org/partial", role="target")
    record = backend.get_artifact(ref=art.artifact.ref)
    cache = tmp_path / "worker-cache"
    hf_hub_download(
        "org/partial", "config.json", revision=commit, cache_dir=str(cache),
        endpoint=default_endpoint(),
    )  # fmt: skip
    snap = cache / "models--org--partial" / "snapshots" / commit
    assert (snap / "config.json").exists() and not (snap / "model.safetensors").exists()
    got = materialise(record, state_dir=tmp_path / "v", cache_dir=cache)
    assert got.path == snap and (snap / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_weights_edited_after_registration_fail_the_job_and_open_a_flag(
    home: Any, cli: Any, tiny: Any, tmp_path: Path, no_mlflow: Any
) -> None:
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(tiny.draft, draft)
    assert cli("artifact", "add", tiny.target_v1, "--name", "tiny/target-v1", "--role",
               "target").rc == 0  # fmt: skip
    assert cli("artifact", "add", str(draft), "--name", "tiny/draft", "--role", "draft").rc == 0
    reg = cli("pair", "register", "--target", "tiny/target-v1@v1", "--draft", "tiny/draft@v1",
              "--method", "draft_model", "--k", "4", "--json").json()  # fmt: skip
    digest = reg["pair"]["pair_digest"]
    weights = draft / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the last tensor's data
    weights.write_bytes(bytes(data))

    r = cli("validate", digest[:12], "--json")
    assert r.rc == 2 and "model.safetensors" in r.err and "differs" in r.err, r.err
    job = cli("jobs", "list", "--json").json()["items"][0]
    assert job["state"] == "failed" and job["attempts"] == 1  # not retried: bytes are wrong
    assert "changed model.safetensors" in job["error"]
    flags = cli("drift", "list", "--kind", "integrity", "--state", "open", "--json").json()
    assert len(flags["items"]) == 1
    flag = flags["items"][0]
    assert flag["effects"]["changed"] == ["model.safetensors"]
    assert flag["artifact_id"] == reg["pair"]["drafter"]["id"]
