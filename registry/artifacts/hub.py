"""Resolve ``hf://org/repo[@revision]`` to an immutable commit and a content manifest.

A branch name is a pointer that moves; an artifact record needs the 40-hex commit it pointed
at and the SHA-256 of every file, in the same shape
:mod:`registry.artifacts.manifest` produces for local directories, so a Hub artifact and its
downloaded copy have the same manifest digest.

Where each file's SHA-256 comes from (the download policy):

* **LFS files** (weights): the Hub reports their SHA-256 (``siblings[i].lfs.sha256``). If the
  file is already in the local Hub cache it is hashed and must match, otherwise
  :class:`HubIntegrityError`. If it is not cached it is *not* downloaded (weights can be
  hundreds of GiB) and the Hub's SHA-256 is recorded — unless ``download="all"``, or the file
  is one the registry reads facts from (:data:`FACT_FILES`: config, tokenizer, model card).
* **Regular git files** (configs, tokenizers, cards): the Hub gives only the git blob id
  (SHA-1), so the content is needed. Taken from the cache when present, otherwise downloaded
  with ``hf_hub_download(revision=<commit>)`` into the cache; git caps them at a few MiB
  (the Hub requires LFS above 10 MiB). Either way the bytes are checked against the blob id.
* Files named ``.git*`` / under ``.github`` are skipped, like in local manifests.

``verified_paths`` lists the files whose *local* bytes were checked against an independent
expectation: the Hub's LFS SHA-256 or git blob id, or, offline, the content address the cache
itself stores them under (``blobs/<sha256>`` for LFS, ``blobs/<git sha1>`` for git files) and
the tree listing ``snapshot_download`` caches under ``trees/<commit>.json``.

Offline (``HF_HUB_OFFLINE=1``, read from the environment *and* ``huggingface_hub.constants``
at call time, or ``offline=True``): no network call at all. The revision must be a commit with
a cached snapshot, or a branch/tag whose ``refs/<name>`` file the cache holds; every file is
hashed from the snapshot directory.

Endpoint, token and cache directory are explicit parameters because ``huggingface_hub`` reads
``HF_ENDPOINT``/``HF_HOME`` once at import time; the defaults here re-read the environment at
call time.

Tokens (:class:`HubAccess`): each repository is read with the token configured for it (by
repository id, then organisation, then ``*``), and with **no** token otherwise: the
process's ambient Hugging Face login (``HF_TOKEN``, the cached ``huggingface-cli login``)
is someone's credential, and a registry serving many clients must not lend it to whoever
names a private repository. An operator may opt back in (``ambient=True``). The same
object caps what one resolve may fetch (files listed, bytes downloaded), as local sources
are capped for remote callers: both are checked against the Hub's listing before anything
is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from registry.artifacts.manifest import (
    IGNORED_NAMES,
    FileHash,
    Manifest,
    ManifestError,
    default_workers,
    hash_file,
    list_files,
)

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEFAULT_REVISION = "main"

FACT_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "README.md",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "vocab.txt",
    }
)
"""Top-level files always fetched (even when stored in LFS): the registry reads tokenizer and
architecture facts from them."""

MAX_GIT_FILE_BYTES = 64 << 20
"""Refuse to auto-download a non-LFS file above this size (the Hub itself rejects >10 MiB)."""


class HubError(Exception):
    """Base class for Hub resolution failures; messages say what and where."""


class HubRefError(HubError, ValueError):
    """The ``hf://`` reference is malformed."""


class RepoNotFound(HubError):
    """The repository does not exist, or is private/gated and the token does not grant access."""


class RevisionNotFound(HubError):
    """The repository exists but the branch, tag or commit does not."""


class EntryNotFound(HubError):
    """A file listed for the commit could not be fetched."""


class HubUnreachable(HubError):
    """The Hub endpoint could not be reached (network, DNS, TLS, server error)."""


class NotInCache(HubError):
    """Offline mode, and the revision or some of its files are not in the local cache."""


class HubLimitExceeded(HubError):
    """The repository lists more files, or would need more bytes fetched, than allowed."""


@dataclass(frozen=True)
class HubAccess:
    """Which token each repository is read with, and how much one resolve may fetch."""

    tokens: Mapping[str, str] = field(default_factory=dict)
    ambient: bool = False
    max_files: int | None = None
    max_bytes: int | None = None

    def token_for(self, repo_id: str) -> str | bool | None:
        """The configured token (repository id, then organisation, then ``*``); otherwise
        ``False`` (``huggingface_hub`` then sends none), or ``None`` (its ambient login)
        when ``ambient``."""
        org = repo_id.split("/", 1)[0]
        for key in (repo_id, org, "*"):
            token = self.tokens.get(key)
            if token:
                return token
        return None if self.ambient else False


class HubIntegrityError(HubError):
    """Local bytes disagree with the digest the Hub (or the cache's content address) expects."""

    def __init__(self, message: str, *, paths: list[str]):
        super().__init__(message)
        self.paths = paths


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str | None = None

    @property
    def uri(self) -> str:
        return f"hf://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")

    def __str__(self) -> str:
        return self.uri


def parse_hf_ref(ref: str) -> HubRef:
    """Parse ``hf://namespace/name[@revision]``; :class:`HubRefError` says what is wrong."""
    expected = "expected hf://<namespace>/<name>[@<revision>], e.g. hf://acme/chat-8b@main"
    if not isinstance(ref, str):
        raise HubRefError(f"Hub reference must be a string, got {type(ref).__name__}; {expected}")
    if not ref.startswith("hf://"):
        raise HubRefError(f"{ref!r} does not start with 'hf://'; {expected}")
    body = ref[len("hf://") :]
    repo_id, at, revision = body.partition("@")
    if at and not revision:
        raise HubRefError(f"{ref!r} has an empty revision after '@'; {expected}")
    if any(c.isspace() for c in body):
        raise HubRefError(f"{ref!r} contains whitespace; {expected}")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise HubRefError(
            f"{ref!r}: repository must be exactly '<namespace>/<name>', got {repo_id!r}; {expected}"
        )
    for part in parts:
        if not _NAME_RE.match(part) or ".." in part or part.endswith((".", "-")):
            raise HubRefError(
                f"{ref!r}: {part!r} is not a valid Hub name (letters, digits, '-', '_', '.'; "
                f"must start with a letter or digit); {expected}"
            )
    if revision and (revision.startswith("/") or revision.endswith("/") or ".." in revision):
        raise HubRefError(f"{ref!r}: {revision!r} is not a valid revision; {expected}")
    return HubRef(repo_id=repo_id, revision=revision or None)


def _as_ref(ref: HubRef | str) -> HubRef:
    return ref if isinstance(ref, HubRef) else parse_hf_ref(ref)


@dataclass(frozen=True)
class ResolvedHubArtifact:
    """A Hub revision pinned to its commit, with a manifest shaped as
    :mod:`registry.artifacts.manifest` makes them.

    ``snapshot_dir`` is the cache's ``snapshots/<commit>`` folder when it exists; it holds at
    least :data:`FACT_FILES` and the git files after an online resolve, every file when
    ``complete_snapshot`` is true.
    """

    repo_id: str
    requested_revision: str | None
    commit: str
    entries: list[dict[str, Any]]
    snapshot_dir: Path | None
    verified_paths: frozenset[str]
    complete_snapshot: bool
    offline: bool
    endpoint: str | None = None
    lfs_paths: frozenset[str] = field(default_factory=frozenset)

    @property
    def uri(self) -> str:
        """The immutable source URI to record: ``hf://repo@<commit>``."""
        return f"hf://{self.repo_id}@{self.commit}"

    @property
    def manifest(self) -> Manifest:
        return Manifest.from_entries(self.entries)


# --- environment, read at call time ---------------------------------------------------------


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_offline() -> bool:
    """``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` from the environment now, or the value
    ``huggingface_hub.constants`` captured at import (what the client itself obeys)."""
    from huggingface_hub import constants

    return (
        _truthy(os.environ.get("HF_HUB_OFFLINE"))
        or _truthy(os.environ.get("TRANSFORMERS_OFFLINE"))
        or bool(constants.HF_HUB_OFFLINE)
    )


def default_endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def default_cache_dir() -> Path:
    """``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else the client's import-time default."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    return Path(constants.HF_HUB_CACHE)


def repo_cache_dir(repo_id: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/models--<namespace>--<name>``, the client's layout."""
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return base / ("models--" + repo_id.replace("/", "--"))


# --- error mapping ---------------------------------------------------------------------------


def _transport_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for mod in ("httpx2", "httpx", "requests"):
        try:
            module = __import__(mod)
        except ImportError:
            continue
        for name in ("TransportError", "ConnectionError", "Timeout"):
            exc = getattr(module, name, None)
            if isinstance(exc, type) and issubclass(exc, BaseException):
                errors.append(exc)
    return tuple(errors)


@contextlib.contextmanager
def _hub_errors(ref: HubRef, endpoint: str, what: str) -> Iterator[None]:
    """Translate the client's exceptions into :class:`HubError` subclasses with context."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = ref.revision or DEFAULT_REVISION
    try:
        yield
    except HubError:
        raise
    except RevisionNotFoundError as exc:
        raise RevisionNotFound(
            f"revision {rev!r} not found in {ref.repo_id} at {endpoint} (while {what})"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise RepoNotFound(
            f"repository {ref.repo_id} not found at {endpoint} (while {what}); if it is private "
            "or gated, pass a token that grants access"
        ) from exc
    except OfflineModeIsEnabled as exc:
        raise NotInCache(f"offline mode is enabled and {what} needs the network") from exc
    except LocalEntryNotFoundError as exc:
        # hf_hub_download raises this when the HEAD failed (network) and nothing is cached.
        raise HubUnreachable(f"cannot reach {endpoint} while {what}: {exc}") from exc
    except EntryNotFoundError as exc:
        raise EntryNotFound(f"file not found in {ref.repo_id}@{rev} while {what}") from exc
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        raise HubUnreachable(
            f"Hub request failed at {endpoint} while {what} (HTTP {status}): {exc}"
        ) from exc
    except _transport_errors() as exc:
        raise HubUnreachable(
            f"cannot reach {endpoint} while {what}: {type(exc).__name__}: {exc}"
        ) from exc


# --- public API ------------------------------------------------------------------------------


def branch_head(
    ref: HubRef | str,
    *,
    endpoint: str | None = None,
    token: str | bool | None = None,
    access: HubAccess | None = None,
) -> str:
    """The commit a branch/tag points at now (one ``model_info`` call), for watchers."""
    from huggingface_hub import HfApi

    ref = _as_ref(ref)
    if access is not None:
        token = access.token_for(ref.repo_id)
    endpoint = (endpoint or default_endpoint()).rstrip("/")
    if is_offline():
        raise NotInCache(f"offline mode is enabled; cannot ask {endpoint} where {ref} points")
    with _hub_errors(ref, endpoint, "reading the branch head"):
        info = HfApi(endpoint=endpoint, token=token).model_info(
            ref.repo_id, revision=ref.revision or DEFAULT_REVISION
        )
    return _check_commit(info.sha, ref, endpoint)


def resolve(
    ref: HubRef | str,
    *,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    download: Literal["small", "all"] = "small",
    offline: bool | None = None,
    workers: int | None = None,
    access: HubAccess | None = None,
) -> ResolvedHubArtifact:
    """Pin ``ref`` to its commit and build its manifest (policy in the module docstring).

    ``download="small"`` fetches git files and :data:`FACT_FILES`; ``"all"`` fetches every
    file (``snapshot_download``) so every entry is hashed locally. ``access`` (when given)
    picks the token and caps files and bytes; ``token`` is used as given otherwise.
    """
    ref = _as_ref(ref)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if offline is None:
        offline = is_offline()
    if offline:
        return _resolve_offline(ref, cache, workers)
    endpoint = (endpoint or default_endpoint()).rstrip("/")
    if access is not None:
        token = access.token_for(ref.repo_id)
    return _resolve_online(ref, endpoint, token, cache, download, workers, access)


# --- internals -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Remote:
    size: int | None
    blob_id: str | None
    lfs_sha256: str | None


def _to_fetch(remote: dict[str, _Remote], snapshot: Path, download: str) -> dict[str, int]:
    """The files (and sizes) a resolve would download: what the cache lacks, of every file
    (``all``) or of the git files and :data:`FACT_FILES` (``small``)."""
    out = {}
    for path, r in remote.items():
        if (snapshot / path).exists():
            continue
        if download == "small" and r.lfs_sha256 is not None and path not in FACT_FILES:
            continue
        out[path] = r.size or 0
    return out


def _check_limits(
    ref: HubRef, remote: dict[str, _Remote], snapshot: Path, download: str, access: HubAccess
) -> None:
    """Refuse before downloading anything: too many files listed, or too many bytes to fetch
    (sizes as the Hub lists them; each download is then checked against its digest)."""
    if access.max_files is not None and len(remote) > access.max_files:
        raise HubLimitExceeded(
            f"{ref}: lists {len(remote)} files, more than the {access.max_files} allowed "
            "(PAIRREG_MAX_SOURCE_FILES)"
        )
    if access.max_bytes is not None:
        fetch = sum(_to_fetch(remote, snapshot, download).values())
        if fetch > access.max_bytes:
            raise HubLimitExceeded(
                f"{ref}: would fetch {fetch} bytes, more than the {access.max_bytes} allowed "
                "(PAIRREG_MAX_SOURCE_BYTES)"
            )


def _skipped(path: str) -> bool:
    return any(part in IGNORED_NAMES for part in path.split("/"))


def _check_commit(sha: str | None, ref: HubRef, endpoint: str) -> str:
    if not sha or not COMMIT_RE.match(sha):
        raise HubError(f"{endpoint} returned no valid commit for {ref} (got {sha!r})")
    return sha


def _resolve_online(
    ref: HubRef,
    endpoint: str,
    token: str | bool | None,
    cache: Path,
    download: str,
    workers: int | None,
    access: HubAccess | None = None,
) -> ResolvedHubArtifact:
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    if download not in ("small", "all"):
        raise ValueError(f"download must be 'small' or 'all', not {download!r}")
    api = HfApi(endpoint=endpoint, token=token)
    with _hub_errors(ref, endpoint, "resolving the revision"):
        info = api.model_info(
            ref.repo_id, revision=ref.revision or DEFAULT_REVISION, files_metadata=True
        )
    commit = _check_commit(info.sha, ref, endpoint)
    remote: dict[str, _Remote] = {}
    for s in info.siblings or []:
        if _skipped(s.rfilename):
            continue
        lfs = s.lfs
        remote[s.rfilename] = _Remote(
            size=(lfs.size if lfs is not None else s.size),
            blob_id=s.blob_id,
            lfs_sha256=(lfs.sha256.lower() if lfs is not None else None),
        )

    storage = repo_cache_dir(ref.repo_id, cache)
    snapshot = storage / "snapshots" / commit
    pinned = HubRef(ref.repo_id, commit)
    if access is not None:
        _check_limits(pinned, remote, snapshot, download, access)
    if download == "all":
        with _hub_errors(pinned, endpoint, "downloading the snapshot"):
            snapshot_download(
                ref.repo_id, revision=commit, cache_dir=str(cache), endpoint=endpoint, token=token
            )
    else:
        for path, r in sorted(remote.items()):
            if (snapshot / path).exists():
                continue
            if r.lfs_sha256 is not None and path not in FACT_FILES:
                continue
            if r.lfs_sha256 is None and (r.size or 0) > MAX_GIT_FILE_BYTES:
                raise HubError(
                    f"{ref.repo_id}@{commit}: {path} is a {r.size}-byte non-LFS file, above the "
                    f"{MAX_GIT_FILE_BYTES}-byte auto-download limit"
                )
            with _hub_errors(pinned, endpoint, f"downloading {path}"):
                hf_hub_download(
                    ref.repo_id,
                    path,
                    revision=commit,
                    cache_dir=str(cache),
                    endpoint=endpoint,
                    token=token,
                )
    if ref.revision != commit and snapshot.is_dir():
        _write_ref(storage, ref.revision or DEFAULT_REVISION, commit)

    local = [p for p in remote if (snapshot / p).exists()]
    hashes = _hash_local(
        snapshot, storage, local, {p for p in local if remote[p].lfs_sha256 is None}, workers
    )
    entries: list[dict[str, Any]] = []
    verified: set[str] = set()
    problems: list[str] = []
    for path, r in sorted(remote.items()):
        fh = hashes.get(path)
        if fh is None:
            if r.lfs_sha256 is None or r.size is None:
                raise EntryNotFound(f"{ref.repo_id}@{commit}: {path} is not available locally")
            entries.append({"path": path, "size": r.size, "sha256": r.lfs_sha256})
            continue
        problems += _check_against(path, fh, r)
        problems += _check_content_address(snapshot / path, fh)
        verified.add(path)
        entries.append({"path": path, "size": fh.size, "sha256": fh.sha256})
    if problems:
        raise HubIntegrityError(
            f"{ref.repo_id}@{commit}: local copy does not match the Hub: " + "; ".join(problems),
            paths=sorted({p.split(":", 1)[0] for p in problems}),
        )
    return ResolvedHubArtifact(
        repo_id=ref.repo_id,
        requested_revision=ref.revision,
        commit=commit,
        entries=Manifest.from_entries(entries).entries,
        snapshot_dir=snapshot if snapshot.is_dir() else None,
        verified_paths=frozenset(verified),
        complete_snapshot=len(hashes) == len(remote),
        offline=False,
        endpoint=endpoint,
        lfs_paths=frozenset(p for p, r in remote.items() if r.lfs_sha256 is not None),
    )


def _resolve_offline(ref: HubRef, cache: Path, workers: int | None) -> ResolvedHubArtifact:
    storage = repo_cache_dir(ref.repo_id, cache)
    rev = ref.revision or DEFAULT_REVISION
    if COMMIT_RE.match(rev):
        commit = rev
    else:
        ref_file = storage / "refs" / rev
        try:
            commit = ref_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise NotInCache(
                f"offline mode: {ref} cannot be resolved — the cache at {cache} has no "
                f"'refs/{rev}' for {ref.repo_id}; resolve it once online or pass a commit"
            ) from None
        except OSError as exc:
            raise NotInCache(f"offline mode: cannot read {ref_file}: {exc}") from exc
        if not COMMIT_RE.match(commit):
            raise NotInCache(f"offline mode: {ref_file} does not hold a commit ({commit!r})")
    snapshot = storage / "snapshots" / commit
    if not snapshot.is_dir():
        raise NotInCache(
            f"offline mode: commit {commit} of {ref.repo_id} is not in the cache at {cache}"
        )
    try:
        paths = [rel for rel, _ in list_files(snapshot, storage)]
    except ManifestError as exc:
        raise HubIntegrityError(f"{ref.repo_id}@{commit}: {exc}", paths=[exc.path or ""]) from exc
    tree = _read_tree_cache(storage, commit)
    if tree is not None:
        present = set(paths)
        missing = sorted(p for p in tree if not _skipped(p) and p not in present)
        if missing:
            raise NotInCache(
                f"offline mode: the cached snapshot of {ref.repo_id}@{commit} is incomplete; "
                f"missing {len(missing)} file(s): {', '.join(missing[:5])}"
            )
    want_git = {
        p
        for p in paths
        if (tree and p in tree and not tree[p].lfs_sha256)
        or COMMIT_RE.match(_blob_name(snapshot / p) or "")
    }
    hashes = _hash_local(snapshot, storage, paths, want_git, workers)
    problems: list[str] = []
    verified: set[str] = set()
    for path, fh in hashes.items():
        checks: list[str] = []
        if tree is not None and path in tree:
            checks += _check_against(path, fh, tree[path])
            verified.add(path)
        addr = _check_content_address(snapshot / path, fh)
        if _blob_name(snapshot / path) is not None:
            verified.add(path)
        problems += checks + addr
    if problems:
        raise HubIntegrityError(
            f"{ref.repo_id}@{commit}: cached files are corrupted: " + "; ".join(problems),
            paths=sorted({p.split(":", 1)[0] for p in problems}),
        )
    entries = [{"path": p, "size": fh.size, "sha256": fh.sha256} for p, fh in hashes.items()]
    return ResolvedHubArtifact(
        repo_id=ref.repo_id,
        requested_revision=ref.revision,
        commit=commit,
        entries=Manifest.from_entries(entries).entries,
        snapshot_dir=snapshot,
        verified_paths=frozenset(verified),
        complete_snapshot=tree is not None,
        offline=True,
        endpoint=None,
        lfs_paths=frozenset(
            p
            for p in paths
            if (tree and p in tree and tree[p].lfs_sha256)
            or _SHA256_RE.match(_blob_name(snapshot / p) or "")
        ),
    )


def _hash_local(
    snapshot: Path, storage: Path, paths: list[str], want_git: set[str], workers: int | None
) -> dict[str, FileHash]:
    """Hash snapshot files in parallel; symlinks must stay inside the repo's cache folder."""
    allowed = os.path.realpath(storage) + os.sep

    def one(path: str) -> tuple[str, FileHash]:
        full = snapshot / path
        real = os.path.realpath(full)
        if not real.startswith(allowed):
            raise HubIntegrityError(
                f"{full} resolves outside the repository cache ({real})", paths=[path]
            )
        try:
            return path, hash_file(real, git_blob_sha1=path in want_git)
        except ManifestError as exc:
            raise HubIntegrityError(str(exc), paths=[path]) from exc

    n = default_workers() if workers is None else max(1, workers)
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="pairreg-hub-hash") as pool:
        return dict(sorted(pool.map(one, paths)))


def _check_against(path: str, fh: FileHash, r: _Remote) -> list[str]:
    out = []
    if r.size is not None and fh.size != r.size:
        out.append(f"{path}: size {fh.size} != expected {r.size}")
    if r.lfs_sha256 is not None:
        if fh.sha256 != r.lfs_sha256:
            out.append(f"{path}: sha256 {fh.sha256} != LFS sha256 {r.lfs_sha256}")
    elif r.blob_id and fh.git_sha1 is not None and fh.git_sha1 != r.blob_id:
        out.append(f"{path}: git blob id {fh.git_sha1} != expected {r.blob_id}")
    return out


def _blob_name(path: Path) -> str | None:
    """The content address a cache symlink points at (``blobs/<etag>``), if it is one."""
    if not path.is_symlink():
        return None
    target = Path(os.path.realpath(path))
    if target.parent.name != "blobs":
        return None
    name = target.name
    return name if (COMMIT_RE.match(name) or _SHA256_RE.match(name)) else None


def _check_content_address(path: Path, fh: FileHash) -> list[str]:
    name = _blob_name(path)
    rel = path.name
    if name is None:
        return []
    if _SHA256_RE.match(name) and fh.sha256 != name:
        return [f"{rel}: content sha256 {fh.sha256} != cache blob name {name}"]
    if COMMIT_RE.match(name) and fh.git_sha1 is not None and fh.git_sha1 != name:
        return [f"{rel}: content git blob id {fh.git_sha1} != cache blob name {name}"]
    return []


def _read_tree_cache(storage: Path, commit: str) -> dict[str, _Remote] | None:
    """The listing ``snapshot_download`` caches at ``trees/<commit>.json`` (format 1), if any."""
    path = storage / "trees" / f"{commit}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format_version") != 1:
        return None
    out: dict[str, _Remote] = {}
    for name, info in (data.get("files") or {}).items():
        if not isinstance(info, dict):
            return None
        sha = info.get("lfs_sha256")
        out[name] = _Remote(
            size=info.get("lfs_size") if sha else info.get("size"),
            blob_id=info.get("blob_id"),
            lfs_sha256=sha.lower() if isinstance(sha, str) else None,
        )
    return out


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """Record ``refs/<revision>`` as the client does after a branch download, so a later offline
    resolve of the same branch finds the commit. Atomic: readers never see a partial file."""
    ref_path = storage / "refs" / revision
    try:
        if ref_path.is_file() and ref_path.read_text(encoding="utf-8").strip() == commit:
            return
        ref_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=ref_path.parent, prefix=".ref-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(commit)
        os.replace(tmp, ref_path)
    except OSError:
        pass  # a read-only cache only costs the offline shortcut
