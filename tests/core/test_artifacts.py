"""Artifacts end to end through the CLI: manifests, lineages, provenance, verify."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.settings import Settings
from tests.core.conftest import CliResult, audit_actions, audit_events, counts
from tests.fixtures import write_fake_model

DOCS = Path(__file__).resolve().parents[2] / "docs" / "registry.md"


def doc_snippet(name: str) -> str:
    """The Python block that follows ``<!-- snippet: NAME -->`` in docs/registry.md."""
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(rf"<!-- snippet: {name} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"snippet {name} missing from {DOCS}"
    return match.group(1)


def add(cli: Callable[..., CliResult], path: Path | str, name: str, role: str, *extra: str):
    res = cli("artifact", "add", str(path), "--name", name, "--role", role, "--json", *extra)
    assert res.rc == 0, res.err
    return res.json()


def test_manifest_and_digest_match_the_documented_recipe(
    home: Settings, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    model = write_fake_model(tmp_path / "m")
    (model / "sub" / "deeper").mkdir(parents=True)
    (model / "sub" / "deeper" / "shard.bin").write_bytes(os.urandom(3000))
    (model / "naïve.txt").write_text("unicode name")
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (model / ".gitattributes").write_text("*.bin filter=lfs")
    (model / "sub" / ".github").mkdir()
    (model / "sub" / ".github" / "ci.yml").write_text("x")
    (model / "link.json").symlink_to("config.json")

    art = add(cli, model, "acme/t", "target")["artifact"]
    paths = [e["path"] for e in art["manifest"]]
    assert paths == sorted(paths)
    assert set(paths) == {
        "config.json",
        "link.json",
        "model.safetensors",
        "naïve.txt",
        "sub/deeper/shard.bin",
        "tokenizer.json",
    }
    for entry in art["manifest"]:
        data = (model / entry["path"]).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert art["file_count"] == 6
    assert art["total_size"] == sum(e["size"] for e in art["manifest"])

    # The digest, recomputed by the exact snippet the docs give auditors.
    proc = subprocess.run(
        [sys.executable, "-c", doc_snippet("manifest-digest"), str(model)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == art["manifest_digest"]
    signing = hashlib.sha256(b"".join(bytes.fromhex(e["sha256"]) for e in art["manifest"]))
    assert art["signing_root"] == signing.hexdigest()


def test_readd_lineage_versions_and_target_changed(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    first = add(cli, models["t1"], "acme/t", "target")
    assert first["created"] is True and first["target_changed"] is False
    v1 = first["artifact"]
    assert (v1["version"], v1["ref"]) == (1, "acme/t@v1")
    before = counts(url)

    again = add(cli, models["t1"], "acme/t", "target")
    assert again["created"] is False
    assert again["artifact"]["id"] == v1["id"]
    assert again["artifact"]["manifest_digest"] == v1["manifest_digest"]
    assert counts(url) == before, "re-adding identical content writes nothing"

    second = add(cli, models["t2"], "acme/t", "target")
    v2 = second["artifact"]
    assert second["created"] is True and second["target_changed"] is True
    assert v2["version"] == 2 and v2["manifest_digest"] != v1["manifest_digest"]
    changed = audit_events(url, "target.changed")
    assert len(changed) == 1
    assert changed[0].entity_id == "acme/t"
    assert json.loads(changed[0].payload) == {
        "previous_artifact_id": v1["id"],
        "previous_manifest_digest": v1["manifest_digest"],
        "artifact_id": v2["id"],
        "manifest_digest": v2["manifest_digest"],
    }

    # Draft lineages version too, but a new draft is not a target change.
    add(cli, models["draft"], "acme/d", "draft")
    d2 = write_fake_model(models["draft"].parent / "d2", hidden_size=32, weights=b"draft-2")
    res = add(cli, d2, "acme/d", "draft")
    assert res["artifact"]["version"] == 2 and res["target_changed"] is False
    assert audit_actions(url).count("target.changed") == 1
    assert audit_actions(url).count("artifact.added") == 4


def test_role_clash_is_a_conflict_and_writes_nothing(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    add(cli, models["t1"], "acme/t", "target")
    before = counts(url)
    res = cli("artifact", "add", str(models["draft"]), "--name", "acme/t", "--role", "draft")
    assert res.rc == 2
    assert res.err.count("\n") == 1 and "acme/t holds target artifacts" in res.err
    assert counts(url) == before


def test_provenance_stored_missing_named_and_trained_against_resolved(
    url: str, cli: Callable[..., CliResult], models: dict[str, Path]
) -> None:
    target = add(cli, models["t1"], "acme/t", "target")["artifact"]
    assert target["provenance_missing"] == [
        "publisher",
        "license",
        "source_url",
        "training_data",
        "base_model",
        "trained_against",
        "training_code_revision",
    ]
    draft = add(
        cli,
        models["draft"],
        "acme/d",
        "draft",
        "--publisher",
        "acme",
        "--license",
        "apache-2.0",
        "--trained-against",
        "acme/t@latest",
        "--attestation",
        "slsa=level3",
    )["artifact"]
    prov = draft["provenance"]
    assert prov["publisher"] == "acme" and prov["license"] == "apache-2.0"
    assert prov["trained_against"] == target["manifest_digest"]
    assert prov["attestations"] == {"slsa": "level3"}
    assert draft["provenance_missing"] == [
        "source_url",
        "training_data",
        "base_model",
        "training_code_revision",
    ]
    shown = cli("artifact", "show", draft["manifest_digest"][:12], "--json").json()
    assert shown["provenance"] == prov and shown["id"] == draft["id"]
    human = cli("artifact", "show", "acme/d@v1")
    assert human.rc == 0 and "provenance missing" in human.out and "source_url" in human.out

    # A digest prefix resolves too; an unknown reference is refused and nothing is written.
    other = write_fake_model(models["draft"].parent / "d3", hidden_size=32, weights=b"d3")
    by_prefix = add(
        cli, other, "acme/d", "draft", "--trained-against", target["manifest_digest"][:16]
    )
    assert by_prefix["artifact"]["provenance"]["trained_against"] == target["manifest_digest"]
    before = counts(url)
    bad = cli(
        "artifact",
        "add",
        str(models["t2"]),
        "--name",
        "acme/x",
        "--role",
        "draft",
        "--trained-against",
        "acme/t@v9",
    )
    assert bad.rc == 2 and "acme/t@v9" in bad.err and counts(url) == before


def test_verify_reports_changed_missing_added(
    home: Settings, cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    model = write_fake_model(tmp_path / "m")
    (model / "extra.txt").write_text("keep")
    add(cli, model, "acme/t", "target")
    ok = cli("artifact", "verify", "acme/t@v1", "--json")
    assert ok.rc == 0
    assert ok.json()["ok"] is True and ok.json()["path"] == str(model.resolve())
    assert cli("artifact", "verify", "acme/t@v1").rc == 0

    (model / "model.safetensors").write_bytes(b"tampered")
    (model / "extra.txt").unlink()
    (model / "new.bin").write_bytes(b"new")
    bad = cli("artifact", "verify", "acme/t@v1", "--json")
    assert bad.rc == 1
    report = bad.json()
    assert report["ok"] is False
    assert (report["changed"], report["missing"], report["added"]) == (
        ["model.safetensors"],
        ["extra.txt"],
        ["new.bin"],
    )
    human = cli("artifact", "verify", "1")
    assert human.rc == 1 and "model.safetensors" in human.out and "new.bin" in human.out

    # --path checks another copy.
    copy = write_fake_model(tmp_path / "copy")
    (copy / "extra.txt").write_text("keep")
    assert cli("artifact", "verify", "acme/t@v1", "--path", str(copy)).rc == 0


def test_list_filters_and_hash_workers_setting(
    home: Settings,
    cli: Callable[..., CliResult],
    models: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from registry.services import artifacts as svc

    seen: list[int | None] = []
    real = svc.build_manifest

    def spy(directory, workers=None, **kw):  # type: ignore[no-untyped-def]
        seen.append(workers)
        return real(directory, workers, **kw)

    monkeypatch.setattr(svc, "build_manifest", spy)
    monkeypatch.setenv("PAIRREG_HASH_WORKERS", "3")
    add(cli, models["t1"], "acme/t", "target")
    add(cli, models["t2"], "acme/t", "target")
    add(cli, models["draft"], "acme/d", "draft")
    assert cli("artifact", "verify", "acme/d@v1").rc == 0
    assert seen == [3, 3, 3, 3]

    page = cli("artifact", "list", "--json").json()
    assert [a["ref"] for a in page["items"]] == ["acme/t@v1", "acme/t@v2", "acme/d@v1"]
    assert all(a["manifest"] is None for a in page["items"])
    only = cli("artifact", "list", "--role", "draft", "--json").json()["items"]
    assert [a["ref"] for a in only] == ["acme/d@v1"]
    lineage = cli("artifact", "list", "--lineage", "acme/t", "--limit", "1", "--json").json()
    assert [a["ref"] for a in lineage["items"]] == ["acme/t@v1"] and lineage["next_cursor"]
    rest = cli(
        "artifact", "list", "--lineage", "acme/t", "--cursor", lineage["next_cursor"], "--json"
    ).json()
    assert [a["ref"] for a in rest["items"]] == ["acme/t@v2"]
    assert json.loads(json.dumps(rest))  # plain JSON
