"""Content manifests: every file of an artifact, by path, size and SHA-256.

An artifact is recorded by what its bytes are, not by what it is called, so re-registering
identical content is recognisable and any silent change (a re-pushed branch, a corrupted
cache blob, a swapped shard) shows up as a different digest.

Definitions (these are part of the record format; changing them changes every digest):

* **Entry**: ``{"path": <relative POSIX path>, "size": <bytes>, "sha256": <64 lowercase hex>}``.
  ``size`` is the number of bytes actually hashed.
* **Manifest digest** (:func:`manifest_digest`): SHA-256 (lowercase hex) of the UTF-8 encoding
  of ``json.dumps(sorted(entries, key=path), sort_keys=True, separators=(",", ":"))`` with the
  default ``ensure_ascii=True`` (so the JSON text is pure ASCII and any non-ASCII path is
  written as ``\\uXXXX`` escapes). It binds names *and* contents: renaming a file changes it.
  Paths sort by Python string order (Unicode code points), which equals UTF-8 byte order.
* **Model-signing style root** (:func:`model_signing_root`): SHA-256 (lowercase hex) over the
  concatenation of the raw 32-byte file digests in sorted path order, names not included, as
  the OpenSSF model-signing tool's root digest covers the digests but not the names. It is
  stored for interoperability; the manifest digest is the identity.

Walking rules: ``.git``, ``.gitattributes``, ``.gitignore`` and ``.github`` are skipped at every
level (VCS metadata is not model content). Symlinks are followed to their target's content and
recorded under the *link's* path, because the Hugging Face cache presents every snapshot file
as a symlink into ``blobs/``. A symlink whose target resolves outside ``symlink_root`` (by
default the directory being hashed) is refused with :class:`ManifestError`: content from
elsewhere on the machine must not silently become part of an artifact. Symlink cycles, dangling
links and non-regular files (FIFOs, sockets, devices) are refused too.

Hashing streams each file through one reused 1 MiB buffer (``readinto`` + ``memoryview``), so
memory stays flat whatever the file size. SHA-256 is sequential within a file, so parallelism is
across files: a thread pool, which scales because hashlib releases the GIL for updates larger
than 2 KiB.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK_SIZE = 1 << 20
"""Bytes read per ``readinto`` call: large enough that per-call overhead vanishes and hashlib
drops the GIL, small enough that ``workers`` buffers are negligible memory."""

IGNORED_NAMES = frozenset({".git", ".gitattributes", ".gitignore", ".github"})
"""Names skipped at any depth (files or directories)."""

ENTRY_KEYS = ("path", "size", "sha256")


class ManifestError(Exception):
    """A directory cannot be turned into a trustworthy manifest; the message names the path."""

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


class ManifestTooLarge(ManifestError):
    """A directory holds more files or bytes than the caller allows; nothing was hashed."""


@dataclass(frozen=True)
class FileHash:
    """Digests of one file's content. ``git_sha1`` is the git blob id, computed only on request
    (it lets a Hub client check non-LFS files against the ``blobId`` the Hub reports)."""

    size: int
    sha256: str
    git_sha1: str | None = None


_buffers = threading.local()


def _buffer() -> bytearray:
    """One reusable read buffer per thread (the pool's threads are long-lived)."""
    buf = getattr(_buffers, "buf", None)
    if buf is None:
        buf = bytearray(CHUNK_SIZE)
        _buffers.buf = buf
    return buf


def hash_file(path: str | os.PathLike[str], *, git_blob_sha1: bool = False) -> FileHash:
    """Stream ``path`` through SHA-256 (and optionally the git blob SHA-1) in 1 MiB chunks.

    The git blob id is ``sha1(b"blob <size>\\0" + content)``; its header needs the size up
    front, taken from ``fstat`` and cross-checked against the bytes actually read, so a file
    that changes while it is hashed is reported instead of producing a wrong id.
    """
    buf = _buffer()
    view = memoryview(buf)
    sha = hashlib.sha256()
    try:
        with open(path, "rb", buffering=0) as fh:
            fd = fh.fileno()
            if hasattr(os, "posix_fadvise"):
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                except OSError:
                    pass
            git = None
            declared = 0
            if git_blob_sha1:
                declared = os.fstat(fd).st_size
                git = hashlib.sha1(b"blob %d\0" % declared, usedforsecurity=False)
            total = 0
            while True:
                n = fh.readinto(buf)
                if not n:
                    break
                chunk = view[:n] if n < CHUNK_SIZE else view
                sha.update(chunk)
                if git is not None:
                    git.update(chunk)
                total += n
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}", path=path) from exc
    if git is not None and total != declared:
        raise ManifestError(f"{path} changed size while being hashed", path=path)
    return FileHash(total, sha.hexdigest(), git.hexdigest() if git is not None else None)


def _within(target: str, root: str) -> bool:
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def list_files(
    root: Path, symlink_root: Path, *, max_files: int | None = None
) -> list[tuple[str, str]]:
    """Return ``(relative posix path, real file path)`` for every file to hash.

    Walks with ``os.scandir`` rather than ``os.walk`` so symlinks are seen (and checked) one
    by one; symlinked directories inside the allowed root are descended, guarding cycles by
    the chain of real ancestor directories. With ``max_files``, the walk stops as soon as
    one file more is found (:class:`ManifestTooLarge`), so a huge tree is not listed whole.
    """
    real_root = os.path.realpath(root)
    allowed = os.path.realpath(symlink_root)
    found: list[tuple[str, str]] = []
    # (directory to list, relative prefix, real paths of the directories above and including it)
    stack: list[tuple[str, str, tuple[str, ...]]] = [(str(root), "", (real_root,))]
    while stack:
        directory, prefix, chain = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError as exc:
            raise ManifestError(
                f"cannot list {directory}: {exc.strerror or exc}", path=directory
            ) from exc
        for entry in entries:
            if entry.name in IGNORED_NAMES:
                continue
            rel = prefix + entry.name
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _within(target, allowed):
                        raise ManifestError(
                            f"symlink {rel!r} points outside {allowed} (to {target}); "
                            "refusing to include content from elsewhere",
                            path=entry.path,
                        )
                    if os.path.isdir(target):
                        if any(_within(anc, target) for anc in chain):
                            raise ManifestError(
                                f"symlink {rel!r} creates a directory cycle (to {target})",
                                path=entry.path,
                            )
                        stack.append((entry.path, rel + "/", chain + (target,)))
                    elif os.path.isfile(target):
                        found.append((rel, target))
                        _check_count(found, max_files, root)
                    elif not os.path.exists(target):
                        raise ManifestError(
                            f"symlink {rel!r} is dangling (to {target})", path=entry.path
                        )
                    else:
                        raise ManifestError(
                            f"symlink {rel!r} points to a non-regular file", path=entry.path
                        )
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, rel + "/", chain + (os.path.realpath(entry.path),)))
                elif entry.is_file(follow_symlinks=False):
                    found.append((rel, entry.path))
                    _check_count(found, max_files, root)
                else:
                    raise ManifestError(
                        f"{rel!r} is not a regular file (FIFO, socket or device)", path=entry.path
                    )
            except OSError as exc:
                raise ManifestError(
                    f"cannot inspect {entry.path}: {exc.strerror or exc}", path=entry.path
                ) from exc
    return found


def _check_count(found: list[tuple[str, str]], max_files: int | None, root: Path) -> None:
    if max_files is not None and len(found) > max_files:
        raise ManifestTooLarge(f"{root} holds more than {max_files} files", path=root)


def _check_bytes(files: list[tuple[str, str]], max_bytes: int | None, root: Path) -> None:
    if max_bytes is None:
        return
    total = sum(_size_or_zero(real) for _, real in files)
    if total > max_bytes:
        raise ManifestTooLarge(
            f"{root} holds {total} bytes, more than the {max_bytes} allowed", path=root
        )


def _normalise_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Keep exactly the three manifest keys, with canonical types, so a digest never depends on
    extra fields or on ``"12"`` versus ``12``."""
    try:
        sha = str(entry["sha256"]).lower()
        out = {"path": str(entry["path"]), "size": int(entry["size"]), "sha256": sha}
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"malformed manifest entry {dict(entry)!r}: {exc}") from exc
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ManifestError(f"malformed sha256 {sha!r} for {out['path']!r}", path=out["path"])
    return out


def _sorted_entries(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    normalised = [_normalise_entry(e) for e in entries]
    normalised.sort(key=lambda e: e["path"])
    for a, b in zip(normalised, normalised[1:], strict=False):
        if a["path"] == b["path"]:
            raise ManifestError(f"duplicate path {a['path']!r} in manifest", path=a["path"])
    return normalised


def canonical_manifest_json(entries: Iterable[Mapping[str, Any]]) -> str:
    """The exact text :func:`manifest_digest` hashes (see the module docstring)."""
    return json.dumps(_sorted_entries(entries), sort_keys=True, separators=(",", ":"))


def manifest_digest(entries: Iterable[Mapping[str, Any]]) -> str:
    """SHA-256 hex of the canonical manifest JSON: binds every path, size and content hash."""
    return hashlib.sha256(canonical_manifest_json(entries).encode("utf-8")).hexdigest()


def model_signing_root(entries: Iterable[Mapping[str, Any]]) -> str:
    """Model-signing style root: ``sha256(concat(bytes.fromhex(e.sha256) for e sorted by path))``.

    Covers contents and order but not names, like the OpenSSF model-signing root digest; kept
    so a record can be cross-checked against signatures made with that tooling's conventions.
    """
    h = hashlib.sha256()
    for e in _sorted_entries(entries):
        h.update(bytes.fromhex(e["sha256"]))
    return h.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """A hashed directory. ``entries`` are sorted by path and hold only the three entry keys."""

    entries: list[dict[str, Any]]
    digest: str
    signing_root: str
    total_size: int
    file_count: int

    @classmethod
    def from_entries(cls, entries: Iterable[Mapping[str, Any]]) -> Manifest:
        """Build (and validate) a manifest from entries hashed elsewhere, e.g. Hub metadata."""
        ordered = _sorted_entries(entries)
        return cls(
            entries=ordered,
            digest=manifest_digest(ordered),
            signing_root=model_signing_root(ordered),
            total_size=sum(e["size"] for e in ordered),
            file_count=len(ordered),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "signing_root": self.signing_root,
            "total_size": self.total_size,
            "file_count": self.file_count,
            "entries": [dict(e) for e in self.entries],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=indent)


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_snapshot_root(directory: str | os.PathLike[str]) -> Path:
    """Where a directory's symlinks may point: a Hub cache snapshot
    (``models--org--name/snapshots/<commit>``) links every file into the repository's
    ``blobs/``, so its repository folder; any other directory, itself."""
    resolved = Path(directory).resolve()
    if (
        resolved.parent.name == "snapshots"
        and resolved.parent.parent.name.startswith("models--")
        and _COMMIT.match(resolved.name)
    ):
        return resolved.parent.parent
    return resolved


def default_workers() -> int:
    """One thread per usable core: hashing is CPU-bound once the page cache is warm, and extra
    threads only add seeks when it is cold."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(32, cores))


def build_manifest(
    directory: str | os.PathLike[str],
    workers: int | None = None,
    *,
    symlink_root: str | os.PathLike[str] | None = None,
    max_files: int | None = None,
    max_bytes: int | None = None,
) -> Manifest:
    """Hash every file under ``directory`` (rules in the module docstring).

    ``workers`` threads hash files in parallel (default: one per core; ``1`` is serial and
    gives the identical result). ``symlink_root`` widens where symlinks may point, e.g. the
    ``models--org--name`` folder when hashing a Hub cache snapshot whose files link into
    ``blobs/``. ``max_files`` and ``max_bytes`` refuse (:class:`ManifestTooLarge`) a tree
    beyond them before a single byte is hashed.
    """
    root = Path(directory)
    if not root.exists():
        raise ManifestError(f"{root} does not exist", path=root)
    if not root.is_dir():
        raise ManifestError(f"{root} is not a directory", path=root)
    files = list_files(
        root, Path(symlink_root) if symlink_root is not None else root, max_files=max_files
    )
    _check_bytes(files, max_bytes, root)
    n_workers = default_workers() if workers is None else max(1, int(workers))

    def one(item: tuple[str, str]) -> dict[str, Any]:
        rel, real = item
        fh = hash_file(real)
        return {"path": rel, "size": fh.size, "sha256": fh.sha256}

    if n_workers == 1 or len(files) <= 1:
        entries = [one(item) for item in files]
    else:
        # Largest first so one big file does not start last and leave the other cores idle.
        by_size = sorted(files, key=lambda it: _size_or_zero(it[1]), reverse=True)
        with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="pairreg-hash") as pool:
            entries = list(pool.map(one, by_size))
    return Manifest.from_entries(entries)


def _size_or_zero(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class Diff:
    """Paths whose content differs, paths expected but absent, and paths present but unexpected."""

    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.changed or self.missing or self.added)

    def to_dict(self) -> dict[str, list[str]]:
        return {"changed": self.changed, "missing": self.missing, "added": self.added}


def compare_manifests(
    expected: Manifest | Iterable[Mapping[str, Any]],
    actual: Manifest | Iterable[Mapping[str, Any]],
) -> Diff:
    """Compare a recorded manifest with a freshly built one (``artifact verify``).

    A path is *changed* when its size or SHA-256 differs; all three lists are sorted.
    """
    exp = {e["path"]: e for e in _sorted_entries(_entries_of(expected))}
    act = {e["path"]: e for e in _sorted_entries(_entries_of(actual))}
    changed = sorted(
        p
        for p in exp.keys() & act.keys()
        if (exp[p]["sha256"], exp[p]["size"]) != (act[p]["sha256"], act[p]["size"])
    )
    return Diff(
        changed=changed,
        missing=sorted(exp.keys() - act.keys()),
        added=sorted(act.keys() - exp.keys()),
    )


def _entries_of(m: Manifest | Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    return m.entries if isinstance(m, Manifest) else m
