"""Materialisation: the one step every model load for measurement or serving goes through.

Given an artifact's record, find its files on this machine (its registered local path, or
its Hub snapshot fetched with the configured endpoint and cache) and check them against the
registered manifest before anything loads them. A measurement is recorded against the
manifest digest, so measuring bytes that differ from it would record a lie.

Hashing a multi-GB model before every job is slow, so a file's (size, mtime, inode) is
cached after it has been hashed and found correct: later runs re-hash only files whose stat
changed, and ``full=True`` re-hashes everything. The cache lives under the home
(``cache/verified/<manifest digest>.json``); losing it only costs a re-hash.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.artifacts.manifest import (
    ManifestError,
    compare_manifests,
    hash_file,
    hub_snapshot_root,
    list_files,
)
from registry.errors import InvalidInput, PairregError
from registry.records.core import ArtifactRecord, VerifyReport


class IntegrityError(PairregError):
    """The files on this machine are not the registered bytes."""

    kind = "integrity"
    status = 409
    title = "Files differ from the registered manifest"

    def __init__(self, report: VerifyReport, ref: str):
        parts = [
            f"{k} {', '.join(v[:3])}{' …' if len(v) > 3 else ''}"
            for k, v in (
                ("changed", report.changed),
                ("missing", report.missing),
                ("added", report.added),
            )  # fmt: skip
            if v
        ]
        super().__init__(
            f"artifact {ref} at {report.path} differs from its registered manifest "
            f"{report.manifest_digest[:12]}: " + "; ".join(parts),
            field="artifact",
            details=report.model_dump(),
        )
        self.report = report


@dataclass(frozen=True)
class Materialised:
    """A verified local copy: its directory and how many files had to be re-hashed."""

    path: Path
    rehashed: int
    files: int


def locate(art: ArtifactRecord, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The artifact's directory here: its local path, or its Hub snapshot (downloaded from
    the configured endpoint into the configured cache when not there yet)."""
    if art.local_path and Path(art.local_path).is_dir():
        return Path(art.local_path)
    if art.source_kind == "hf" and art.hub_repo and art.hub_commit:
        from registry.artifacts.hub import default_cache_dir, default_endpoint, repo_cache_dir

        cache = Path(cache_dir) if cache_dir else default_cache_dir()  # read at call time
        snap = repo_cache_dir(art.hub_repo, cache) / "snapshots" / art.hub_commit
        # registration may have fetched only the small files (config, tokenizer) and read
        # the weights' hashes from the Hub's LFS metadata: a snapshot missing any manifest
        # file is completed by the download below, not handed over incomplete
        wanted = [e.path for e in art.manifest or []]
        if snap.is_dir() and all((snap / rel).exists() for rel in wanted):
            return snap
        try:
            from huggingface_hub import snapshot_download

            return Path(
                snapshot_download(
                    art.hub_repo,
                    revision=art.hub_commit,
                    cache_dir=str(cache),
                    endpoint=default_endpoint(),
                )
            )
        except Exception as exc:  # noqa: BLE001 - any download failure is the same to the user
            raise InvalidInput(
                f"artifact {art.ref} is not available locally and could not be downloaded: {exc}",
                field="artifact",
            ) from exc
    raise InvalidInput(f"artifact {art.ref} has no local copy on this machine", field="artifact")


def _stat_key(path: str) -> list[int]:
    st = os.stat(path)  # follows the Hub cache's snapshot -> blob links
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def verify_dir(
    art: ArtifactRecord, directory: Path, *, state_dir: Path | None, full: bool = False
) -> tuple[VerifyReport, int]:
    """Compare ``directory`` with the artifact's manifest; returns the report and how many
    files were hashed (files whose cached stat still matches are trusted)."""
    if art.manifest is None:
        raise InvalidInput(f"artifact {art.ref}: record carries no manifest", field="artifact")
    expected = {e.path: e for e in art.manifest}
    cache_file = state_dir / f"{art.manifest_digest}.json" if state_dir else None
    cache: dict[str, Any] = {}
    if cache_file is not None and cache_file.is_file() and not full:
        try:
            cache = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cache = {}
    seen = cache.get("files", {}) if cache.get("dir") == str(directory) else {}
    try:
        files = list_files(directory, hub_snapshot_root(directory))
    except ManifestError as exc:
        raise InvalidInput(f"artifact {art.ref}: {exc}", field="artifact") from exc
    actual: list[dict[str, Any]] = []
    stats: dict[str, list[int]] = {}
    hashed = 0
    for rel, absolute in files:
        key = _stat_key(absolute)
        stats[rel] = key
        entry = expected.get(rel)
        if entry is not None and seen.get(rel) == key and key[0] == entry.size:
            actual.append({"path": rel, "size": entry.size, "sha256": entry.sha256})
            continue
        fh = hash_file(absolute)
        hashed += 1
        actual.append({"path": rel, "size": fh.size, "sha256": fh.sha256})
    diff = compare_manifests([e.model_dump() for e in art.manifest], actual)
    report = VerifyReport(
        artifact_id=art.id,
        manifest_digest=art.manifest_digest,
        path=str(directory),
        ok=diff.ok,
        changed=list(diff.changed),
        missing=list(diff.missing),
        added=list(diff.added),
    )
    if report.ok and cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"dir": str(directory), "files": stats}))
            tmp.replace(cache_file)
        except OSError:
            pass  # the cache only saves time
    return report, hashed


def materialise(
    art: ArtifactRecord,
    *,
    state_dir: Path | None,
    cache_dir: str | os.PathLike[str] | None = None,
    full: bool = False,
) -> Materialised:
    """Locate the artifact's files and verify them; :class:`IntegrityError` names any file
    that differs. ``state_dir`` keeps the stat cache (None: hash everything every time)."""
    directory = locate(art, cache_dir=cache_dir)
    report, hashed = verify_dir(art, directory, state_dir=state_dir, full=full)
    if not report.ok:
        raise IntegrityError(report, art.ref)
    return Materialised(path=directory, rehashed=hashed, files=len(art.manifest or []))
