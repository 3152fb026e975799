"""A small Hugging Face Hub-compatible HTTP server on loopback, for tests.

It implements only what the real ``huggingface_hub`` client calls for model info, tree
listing and file download, so tests exercise the real client (cache layout, ETags, error
mapping) without network access and without monkeypatching:

* ``GET /api/models/{repo}`` and ``GET /api/models/{repo}/revision/{rev}`` (``?blobs=true``
  adds ``size``, ``blobId`` and ``lfs`` per sibling) — ``HfApi.model_info``/``repo_info``.
* ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=...`` — ``list_repo_tree`` (one page,
  no ``Link`` header), used by ``snapshot_download``.
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` — ``hf_hub_download``: ``X-Repo-Commit``,
  ``ETag`` (LFS: the SHA-256; git files: the blob id), ``X-Linked-Etag``/``X-Linked-Size``
  for LFS files, ``Content-Length``; ``Range: bytes=N-`` on GET. No ``X-Xet-*`` headers are
  ever sent, so the client never switches to hf_xet.
* Errors: 404 with ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound``,
  which the client maps to ``RepositoryNotFoundError`` / ``RevisionNotFoundError`` /
  ``RemoteEntryNotFoundError``.

Repos live in memory (:class:`HubFixture`). A commit id is the SHA-1 of the sorted
``(path, blob id)`` list plus the parent commit, so identical content in the same history gives
the same id and a branch can be moved to a new commit with :meth:`HubFixture.update_branch`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
LFS_THRESHOLD = 10 << 20


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    sha = hashlib.sha256(data).hexdigest()
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
    ).encode()


@dataclass(frozen=True)
class StoredFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def blob_id(self) -> str:
        """Git object id: of the content for git files, of the pointer file for LFS files."""
        return git_blob_id(lfs_pointer(self.data) if self.lfs else self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class FixtureRepo:
    commits: dict[str, dict[str, StoredFile]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)


class HubFixture:
    """In-memory repositories served by :class:`HubServer`; thread-safe."""

    def __init__(self) -> None:
        self.repos: dict[str, FixtureRepo] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _is_lfs(path: str, data: bytes, lfs_paths: set[str] | None) -> bool:
        if lfs_paths is not None:
            return path in lfs_paths
        return path.endswith(LFS_SUFFIXES) or len(data) > LFS_THRESHOLD

    def _commit(
        self,
        repo: FixtureRepo,
        files: Mapping[str, bytes],
        lfs_paths: set[str] | None,
        parent: str | None,
    ) -> str:
        stored = {p: StoredFile(bytes(d), self._is_lfs(p, d, lfs_paths)) for p, d in files.items()}
        h = hashlib.sha1((parent or "").encode())
        for path in sorted(stored):
            h.update(f"{path}\0{stored[path].blob_id}\0{int(stored[path].lfs)}\n".encode())
        sha = h.hexdigest()
        repo.commits[sha] = stored
        return sha

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        branch: str = "main",
        lfs_paths: set[str] | list[str] | None = None,
    ) -> str:
        """Create (or add a branch to) a repo; returns the commit id the branch points at.

        ``lfs_paths=None`` stores weights-like suffixes and files over 10 MiB in LFS, as a
        typical ``.gitattributes`` does; pass a set to choose exactly.
        """
        with self._lock:
            repo = self.repos.setdefault(repo_id, FixtureRepo())
            sha = self._commit(repo, files, set(lfs_paths) if lfs_paths is not None else None, None)
            repo.refs[branch] = sha
            return sha

    def update_branch(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        branch: str = "main",
        lfs_paths: set[str] | list[str] | None = None,
    ) -> str:
        """Commit new content on top of ``branch`` and move the branch; returns the new commit."""
        with self._lock:
            repo = self.repos[repo_id]
            parent = repo.refs.get(branch)
            sha = self._commit(
                repo, files, set(lfs_paths) if lfs_paths is not None else None, parent
            )
            repo.refs[branch] = sha
            return sha

    def set_branch(self, repo_id: str, branch: str, commit: str) -> None:
        """Point ``branch`` at an existing commit (e.g. to simulate a force-push back)."""
        with self._lock:
            repo = self.repos[repo_id]
            if commit not in repo.commits:
                raise KeyError(commit)
            repo.refs[branch] = commit

    def lookup(
        self, repo_id: str, revision: str
    ) -> tuple[str | None, dict[str, StoredFile] | None]:
        """``(None, None)``: no repo; ``(None, {})``: no revision; else ``(commit, files)``."""
        with self._lock:
            repo = self.repos.get(repo_id)
            if repo is None:
                return None, None
            sha = repo.refs.get(revision) or (revision if revision in repo.commits else None)
            if sha is None:
                return None, {}
            return sha, repo.commits[sha]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    # -- helpers ---------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, payload: object, status: int = 200) -> None:
        self._send(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})

    def _error(self, code: str, message: str, commit: str | None = None) -> None:
        headers = {
            "X-Error-Code": code,
            "X-Error-Message": message,
            "Content-Type": "application/json",
        }
        if commit:
            headers["X-Repo-Commit"] = commit
        body = json.dumps({"error": message}).encode()
        if self.command == "HEAD":
            self.send_response(404)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(404, body, headers)

    def _resolve(self, repo_id: str, rev: str) -> tuple[str, dict[str, StoredFile]] | None:
        sha, files = self.server.fixture.lookup(repo_id, rev)
        if files is None:
            self._error("RepoNotFound", f"Repository {repo_id} not found")
            return None
        if sha is None:
            self._error("RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return sha, files

    # -- routes ----------------------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch(head=False)

    def _dispatch(self, head: bool) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        parts = url.path.split("/")[1:]  # raw (still percent-encoded) segments
        self.server.requests.append((self.command, self.path))
        self.server.authorizations.append(self.headers.get("Authorization"))
        if len(parts) >= 4 and parts[0] == "api" and parts[1] == "models":
            repo_id = f"{unquote(parts[2])}/{unquote(parts[3])}"
            rest = parts[4:]
            if not rest:
                return self._model_info(repo_id, "main", query)
            if rest[0] == "revision" and len(rest) == 2:
                return self._model_info(repo_id, unquote(rest[1]), query)
            if rest[0] == "tree" and len(rest) >= 2:
                prefix = unquote("/".join(rest[2:]))
                return self._tree(repo_id, unquote(rest[1]), prefix)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = f"{unquote(parts[0])}/{unquote(parts[1])}"
            return self._file(repo_id, unquote(parts[3]), unquote("/".join(parts[4:])), head)
        self._send(404, b"not found", {"Content-Type": "text/plain"})

    def _model_info(self, repo_id: str, rev: str, query: dict[str, list[str]]) -> None:
        found = self._resolve(repo_id, rev)
        if found is None:
            return
        sha, files = found
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for path in sorted(files):
            f = files[path]
            sib: dict[str, object] = {"rfilename": path}
            if blobs:
                sib["size"] = len(f.data)
                sib["blobId"] = f.blob_id
                if f.lfs:
                    sib["lfs"] = {
                        "size": len(f.data),
                        "sha256": f.sha256,
                        "pointerSize": len(lfs_pointer(f.data)),
                    }
            siblings.append(sib)
        self._json(
            {
                "_id": sha[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": sha,
                "lastModified": "2025-01-01T00:00:00.000Z",
                "private": False,
                "disabled": False,
                "gated": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": siblings,
            }
        )

    def _tree(self, repo_id: str, rev: str, prefix: str) -> None:
        found = self._resolve(repo_id, rev)
        if found is None:
            return
        _, files = found
        base = prefix.rstrip("/") + "/" if prefix else ""
        items: list[dict[str, object]] = []
        dirs: set[str] = set()
        for path in sorted(files):
            if not path.startswith(base):
                continue
            for i in range(base.count("/"), path.count("/")):
                dirs.add("/".join(path.split("/")[: i + 1]))
            f = files[path]
            item: dict[str, object] = {
                "type": "file",
                "oid": f.blob_id,
                "size": len(f.data),
                "path": path,
            }
            if f.lfs:
                item["lfs"] = {
                    "oid": f.sha256,
                    "size": len(f.data),
                    "pointerSize": len(lfs_pointer(f.data)),
                }
            items.append(item)
        for d in sorted(dirs):
            items.append(
                {
                    "type": "directory",
                    "oid": hashlib.sha1(d.encode()).hexdigest(),
                    "size": 0,
                    "path": d,
                }
            )
        self._json(items)

    def _file(self, repo_id: str, rev: str, path: str, head: bool) -> None:
        found = self._resolve(repo_id, rev)
        if found is None:
            return
        sha, files = found
        f = files.get(path)
        if f is None:
            return self._error("EntryNotFound", f"{path} does not exist at {rev}", commit=sha)
        headers = {
            "X-Repo-Commit": sha,
            "ETag": f'"{f.etag}"',
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
        }
        if f.lfs:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(len(f.data))
        data = f.data
        status = 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and not head:
            start_s, _, end_s = rng[len("bytes=") :].partition("-")
            start = int(start_s or 0)
            end = int(end_s) if end_s else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data = data[start : end + 1]
            status = 206
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fixture: HubFixture) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fixture = fixture
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header


class HubServer:
    """A running server: ``endpoint``, the fixture's ``add_repo``/``update_branch``/``set_branch``
        and the ``requests`` log (method, raw path) and ``authorizations`` (each request's
    ``Authorization`` header) for asserting what the client asked and with which token."""

    def __init__(self, fixture: HubFixture | None = None) -> None:
        self.fixture = fixture or HubFixture()
        self.hf_home: Path | None = None
        self.cache_dir: Path | None = None
        self._server = _Server(self.fixture)
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="hubserver", daemon=True
        )

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def requests(self) -> list[tuple[str, str]]:
        return self._server.requests

    @property
    def authorizations(self) -> list[str | None]:
        """The ``Authorization`` header of every request (None when absent), in order."""
        return self._server.authorizations

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        branch: str = "main",
        lfs_paths: set[str] | list[str] | None = None,
    ) -> str:
        return self.fixture.add_repo(repo_id, files, branch=branch, lfs_paths=lfs_paths)

    def update_branch(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        branch: str = "main",
        lfs_paths: set[str] | list[str] | None = None,
    ) -> str:
        return self.fixture.update_branch(repo_id, files, branch=branch, lfs_paths=lfs_paths)

    def set_branch(self, repo_id: str, branch: str, commit: str) -> None:
        self.fixture.set_branch(repo_id, branch, commit)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def loopback_hub(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A loopback Hub with ``HF_ENDPOINT`` pointing at it and ``home`` as an empty
    ``HF_HOME`` (so the real client builds a real cache layout), offline mode off, no token.
    ``huggingface_hub.constants`` captured the environment at import, so pass
    ``endpoint=server.endpoint`` and ``cache_dir=$HF_HOME/hub`` explicitly as well."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        server.hf_home = home
        server.cache_dir = home / "hub"
        yield server


@pytest.fixture
def hub_server(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HubServer]:
    """A fresh loopback Hub per test (see :func:`loopback_hub`)."""
    with loopback_hub(tmp_path_factory.mktemp("hf_home"), monkeypatch) as server:
        yield server
