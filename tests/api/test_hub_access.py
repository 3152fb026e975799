"""Hub registration reads each repository with the token configured for it, never with the
process's ambient Hugging Face login by default, and is capped like a local source (files
listed, bytes fetched), refused before anything is downloaded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from registry.artifacts import hub
from tests.api.conftest import ApiEnv
from tests.fixtures import byte_tokenizer_json
from tests.hubserver import HubServer, loopback_hub

FILES = {
    "config.json": json.dumps({"model_type": "llama", "hidden_size": 64}).encode(),
    "tokenizer.json": b'{"version": "1.0"}',
    "model.safetensors": b"w" * 50_000,
    "extra/a.txt": b"a" * 3000,
    "extra/b.txt": b"b" * 3000,
}
AMBIENT = "hf_ambient_login_of_the_server_account"


@pytest.fixture
def hub_server(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HubServer]:
    with loopback_hub(tmp_path_factory.mktemp("hf_home"), monkeypatch) as server:
        yield server


def _resolve(server: HubServer, ref: str, access: hub.HubAccess | None) -> hub.ResolvedHubArtifact:
    return hub.resolve(ref, endpoint=server.endpoint, cache_dir=server.cache_dir, access=access)


def test_tokens_per_repository_and_no_ambient_login(
    hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", AMBIENT)
    for repo in ("acme/one", "acme/two", "other/x", "third/y"):
        hub_server.add_repo(repo, FILES)
    access = hub.HubAccess(tokens={"acme": "hf_acme", "acme/two": "hf_two", "third": ""})
    seen: dict[str, set[str | None]] = {}
    for repo in ("acme/one", "acme/two", "other/x", "third/y"):
        start = len(hub_server.authorizations)
        _resolve(hub_server, f"hf://{repo}", access)
        seen[repo] = set(hub_server.authorizations[start:])
    assert seen == {
        "acme/one": {"Bearer hf_acme"},
        "acme/two": {"Bearer hf_two"},  # the repository's own token wins over its org's
        "other/x": {None},  # nothing configured: no token at all
        "third/y": {None},  # an empty token is none
    }
    assert AMBIENT not in " ".join(str(a) for a in hub_server.authorizations)
    # the branch watcher too
    start = len(hub_server.authorizations)
    hub.branch_head("hf://other/x", endpoint=hub_server.endpoint, access=hub.HubAccess())
    assert hub_server.authorizations[start:] == [None]
    # the operator's explicit opt-in, and a '*' default
    start = len(hub_server.authorizations)
    hub.branch_head(
        "hf://other/x", endpoint=hub_server.endpoint, access=hub.HubAccess(ambient=True)
    )
    hub.branch_head("hf://other/x", endpoint=hub_server.endpoint,
                    access=hub.HubAccess(tokens={"*": "hf_all"}))  # fmt: skip
    assert hub_server.authorizations[start:] == [f"Bearer {AMBIENT}", "Bearer hf_all"]


def test_files_and_bytes_are_capped_before_any_download(hub_server: HubServer) -> None:
    hub_server.add_repo("acme/big", FILES)
    with pytest.raises(hub.HubLimitExceeded, match="lists 5 files, more than the 4"):
        _resolve(hub_server, "hf://acme/big", hub.HubAccess(max_files=4))
    # 'all' fetches every file (56,060 bytes); the default fetches the git files and fact
    # files (config, tokenizer, a, b: 6,060 bytes) but not the LFS weights
    with pytest.raises(hub.HubLimitExceeded, match="would fetch 56060 bytes"):
        hub.resolve("hf://acme/big", endpoint=hub_server.endpoint,
                    cache_dir=hub_server.cache_dir, download="all",
                    access=hub.HubAccess(max_bytes=10_000))  # fmt: skip
    with pytest.raises(hub.HubLimitExceeded, match="would fetch 6060 bytes"):
        _resolve(hub_server, "hf://acme/big", hub.HubAccess(max_bytes=5000))
    assert not any("/resolve/" in path for _, path in hub_server.requests)  # nothing fetched
    ok = _resolve(hub_server, "hf://acme/big", hub.HubAccess(max_files=5, max_bytes=10_000))
    assert len(ok.entries) == 5


def test_over_http_the_server_uses_only_configured_tokens_and_caps(
    api: ApiEnv, hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", AMBIENT)
    model = {
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 64,
                                   "vocab_size": 258}).encode(),
        "tokenizer.json": json.dumps(byte_tokenizer_json()).encode(),
        "model.safetensors": b"w" * 5000,
        "README.md": b"# card",
    }  # fmt: skip
    hub_server.add_repo("acme/t", model)
    hub_server.add_repo("private/t", model)

    def add(ref: str, name: str):  # type: ignore[no-untyped-def]
        return api.client.post(
            "/v1/artifacts",
            json={"source": ref, "name": name, "role": "target"},
            headers=api.auth("registrar"),
        )

    first = add("hf://acme/t", "acme/t")
    assert first.status_code == 201, first.text
    assert set(hub_server.authorizations) == {None}  # the server's login was not lent
    api.app.state.settings = api.settings.model_copy(
        update={"hub_tokens": {"private": "hf_private"}, "max_source_files": 3}
    )
    refused = add("hf://private/t", "private/t")
    assert refused.status_code == 422 and refused.json()["field"] == "source"
    assert "lists 4 files, more than the 3 allowed" in refused.json()["detail"]
    api.app.state.settings = api.settings.model_copy(update={"hub_tokens": {"private": "hf_p"}})
    start = len(hub_server.authorizations)
    assert add("hf://private/t", "private/t").status_code == 201
    assert set(hub_server.authorizations[start:]) == {"Bearer hf_p"}
