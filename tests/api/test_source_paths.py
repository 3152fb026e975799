"""Paths a caller names for the server to read: literal, and confined when the caller is remote.

Each case is asked twice: over HTTP (a remote client, confined to the artifact roots and the
size limits) and through the embedded backend (the local user, who may name any directory
they can read). ``~`` is never expanded by an operation; the CLI expands it for the local
user before calling one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.backend import local_backend
from registry.artifacts.source_paths import local_directory, path_limits
from registry.errors import InvalidInput
from registry.records.core import SignatureIn
from registry.services.system import initialise, read_credentials
from registry.settings import Settings, reset_settings
from tests.api.conftest import run_cli
from tests.fixtures import write_fake_model


@dataclass
class Env:
    settings: Settings
    http: TestClient
    local: Any  # the embedded backend, acting as the local user
    roots: Path  # the one artifact root
    outside: Path  # a directory of models outside it


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    roots, outside = tmp_path / "roots", tmp_path / "outside"
    roots.mkdir()
    outside.mkdir()
    monkeypatch.setenv("PAIRREG_ARTIFACT_ROOTS", str(roots))
    monkeypatch.setenv("PAIRREG_MAX_SOURCE_FILES", "5")
    monkeypatch.setenv("PAIRREG_MAX_SOURCE_BYTES", "20000")
    reset_settings()
    settings = Settings(home=tmp_path / "home", database_url=f"sqlite:///{tmp_path / 'r.db'}")
    initialise(settings)
    token = (read_credentials(settings.credentials_path) or {})["token"]
    with TestClient(create_app(settings), raise_server_exceptions=False) as http:
        http.headers["Authorization"] = f"Bearer {token}"
        yield Env(settings, http, local_backend(settings, actor="me"), roots, outside)
    reset_settings()


def _remote_add(env: Env, source: str, name: str = "acme/m", **extra: Any) -> Any:
    return env.http.post(
        "/v1/artifacts", json={"source": source, "name": name, "role": "draft", **extra}
    )


def _refused(resp: Any, field: str, *words: str) -> str:
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["field"] == field, body
    for word in words:
        assert word in body["detail"], body["detail"]
    return str(body["detail"])


def _local_refused(env: Env, field: str, **kwargs: Any) -> str:
    with pytest.raises(InvalidInput) as caught:
        env.local.add_artifact(name=kwargs.pop("name", "acme/m"), role="draft", **kwargs)
    assert caught.value.field == field
    return caught.value.message


def test_tilde_is_literal_and_never_a_500(env: Env) -> None:
    """The fuzzer's 500: ``~0`` named an unknown user's home and the server crashed."""
    _refused(_remote_add(env, "~0", name="a/b"), "source", "outside")
    # Under a root the same name is just a relative directory called "~0", which is absent.
    cwd = os.getcwd()
    try:
        os.chdir(env.roots)
        _refused(_remote_add(env, "~0", name="a/b"), "source", "does not exist")
        # ...and when it exists, it is that directory, not anybody's home.
        write_fake_model(env.roots / "~0", weights=b"tilde")
        resp = _remote_add(env, "~0", name="a/b")
        assert resp.status_code == 201, resp.text
        assert resp.json()["artifact"]["source"] == str((env.roots / "~0").resolve())
    finally:
        os.chdir(cwd)
    assert "does not exist" in _local_refused(env, "source", source="~0-absent")
    assert "does not exist" in _local_refused(env, "source", source="~root/nothing-here")


def test_unresolvable_paths_are_refused_naming_the_field(env: Env) -> None:
    loop = env.roots / "loop"
    loop.symlink_to(loop)
    for source in (str(loop), str(env.roots / "nul\x00byte")):
        _refused(_remote_add(env, source), "source")
        _local_refused(env, "source", source=source)


def test_remote_sources_must_lie_under_an_artifact_root(env: Env) -> None:
    inside = write_fake_model(env.roots / "org" / "m", weights=b"in")
    elsewhere = write_fake_model(env.outside / "m", weights=b"out")
    assert _remote_add(env, str(inside)).status_code == 201
    # Outside the roots: refused before its existence is even looked at.
    _refused(_remote_add(env, str(elsewhere), name="acme/o"), "source", "outside", str(env.roots))
    _refused(_remote_add(env, "/etc", name="acme/o"), "source", "outside")
    _refused(_remote_add(env, "/no/such/dir", name="acme/o"), "source", "outside")
    _refused(_remote_add(env, str(env.roots / ".." / "outside" / "m")), "source", "outside")
    # The local user registers what they can read.
    assert env.local.add_artifact(source=str(elsewhere), name="acme/o", role="draft").created


def test_symlinks_escaping_a_root_are_refused(env: Env) -> None:
    elsewhere = write_fake_model(env.outside / "m", weights=b"out")
    link = env.roots / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    _refused(_remote_add(env, str(link)), "source", "outside")
    # A file inside a directory under the root that links out of it.
    leaky = write_fake_model(env.roots / "leaky", weights=b"leaky")
    (leaky / "secret.bin").symlink_to(elsewhere / "model.safetensors")
    _refused(_remote_add(env, str(leaky)), "source", "symlink")
    # A link that stays inside the root is fine.
    inside = write_fake_model(env.roots / "real", weights=b"real")
    (env.roots / "alias").symlink_to(inside, target_is_directory=True)
    resp = _remote_add(env, str(env.roots / "alias"))
    assert resp.status_code == 201, resp.text
    assert resp.json()["artifact"]["source"] == str(inside.resolve())


def test_file_count_and_size_limits_for_remote_sources(env: Env) -> None:
    many = write_fake_model(env.roots / "many", weights=b"w")
    for i in range(5):
        (many / f"extra-{i}.txt").write_text(str(i))
    _refused(_remote_add(env, str(many)), "source", "more than 5 files")
    big = write_fake_model(env.roots / "big", weights=b"x" * 20000)
    _refused(_remote_add(env, str(big), name="acme/b"), "source", "more than the 20000")
    # The same directories, registered by the local user: no limits.
    assert env.local.add_artifact(source=str(many), name="acme/m", role="draft").created
    assert env.local.add_artifact(source=str(big), name="acme/b", role="draft").created


def test_remote_verify_and_signature_paths_are_confined(env: Env) -> None:
    inside = write_fake_model(env.roots / "m", weights=b"in")
    copy = write_fake_model(env.outside / "copy", weights=b"in")
    assert _remote_add(env, str(inside)).status_code == 201
    resp = env.http.post("/v1/artifacts/acme/m@v1/verify", json={"path": str(copy)})
    _refused(resp, "path", "outside")
    resp = env.http.post("/v1/artifacts/acme/m@v1/verify", json={"path": "~0"})
    _refused(resp, "path")
    # Its own recorded copy, and a path under the root, are verified.
    assert env.http.post("/v1/artifacts/acme/m@v1/verify", json={}).json()["ok"] is True
    assert env.local.verify_artifact(ref="acme/m@v1", path=str(copy)).ok is True
    sig = env.outside / "model.sig"
    sig.write_text("{}")
    resp = _remote_add(env, str(inside), signature={"path": str(sig), "public_key": "x"})
    _refused(resp, "signature", "outside")
    with pytest.raises(InvalidInput) as caught:  # locally it is read, and is no signature
        env.local.add_artifact(
            source=str(inside), name="acme/m", role="draft", signature=SignatureIn(path=str(sig))
        )
    assert caught.value.field == "signature" and "outside" not in caught.value.message


def test_default_root_is_models_under_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAIRREG_ARTIFACT_ROOTS", raising=False)
    settings = Settings(home=tmp_path / "home")
    limits = path_limits(settings, remote=True)
    assert limits is not None and limits.roots == (tmp_path / "home" / "models",)
    assert path_limits(settings, remote=False) is None
    write_fake_model(tmp_path / "home" / "models" / "m")
    assert local_directory(str(tmp_path / "home" / "models" / "m"), field="source", limits=limits)
    with pytest.raises(InvalidInput):
        local_directory(str(tmp_path / "home"), field="source", limits=limits)


def test_embedded_cli_expands_tilde_for_the_local_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_home = tmp_path / "user"
    write_fake_model(user_home / "models" / "m", weights=b"cli")
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.setenv("PAIRREG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PAIRREG_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.delenv("PAIRREG_URL", raising=False)
    assert run_cli("init").exit_code == 0
    out = run_cli("artifact", "add", "~/models/m", "--name", "acme/m", "--role", "draft")
    assert out.exit_code == 0, out.output
    assert "registered acme/m@v1" in out.output
    out = run_cli("artifact", "verify", "acme/m@v1", "--path", "~/models/m")
    assert out.exit_code == 0, out.output
