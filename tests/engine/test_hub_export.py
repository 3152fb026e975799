"""A pair registered from the Hub at pinned commits: ``pairreg export vllm`` prints repo and
revision, and vLLM, given only ``HF_ENDPOINT`` (the loopback Hub test server) and an empty
cache, downloads exactly those revisions and serves the pair."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from registry.db import session_scope
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from tests.engine.conftest import EngineRegistry, Engines, K
from tests.engine.test_exports import _check_serves
from tests.hubserver import HubServer, loopback_hub
from tests.requests.conftest import ACTOR, promote_at

DEPLOYMENT = "tiny-hub"
pytestmark = pytest.mark.engine(DEPLOYMENT)


@dataclass
class HubPair:
    server: HubServer
    target_commit: str
    draft_commit: str
    digest: str


def _files(directory: str | Path) -> dict[str, bytes]:
    """The directory's files plus a README, so the Hub copy has its own manifest and the
    pair its own digest (identical content would be the local pair already registered)."""
    files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
    return {**files, "README.md": b"A tiny model on the loopback Hub.\n"}


@pytest.fixture(scope="module")
def hub_pair(
    engine_registry: EngineRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubPair]:
    reg = engine_registry
    with (
        pytest.MonkeyPatch.context() as mp,
        loopback_hub(tmp_path_factory.mktemp("hf-registry"), mp) as server,
    ):
        t_sha = server.add_repo("tiny/target-v1", _files(reg.target_dir))
        d_sha = server.add_repo("tiny/draft", _files(reg.tiny.draft))
        with session_scope(reg.db_url) as s:
            t = art_svc.add_artifact(
                s,
                source=f"hf://tiny/target-v1@{t_sha}",
                name="hub/target-v1",
                role="target",
                actor=ACTOR,
            ).artifact
            d = art_svc.add_artifact(
                s, source=f"hf://tiny/draft@{d_sha}", name="hub/draft", role="draft", actor=ACTOR
            ).artifact
            pair = pair_svc.register_pair(
                s, target=t.ref, draft=d.ref, method="draft_model", k=K, actor=ACTOR
            ).pair
        promote_at(
            reg.db_url, DEPLOYMENT, pair.pair_digest, datetime.now(UTC) - timedelta(minutes=1)
        )
        yield HubPair(server, t_sha, d_sha, pair.pair_digest)


def test_hub_export_downloads_the_pinned_revisions_and_serves(
    engines: Engines, engine_registry: EngineRegistry, hub_pair: HubPair,
    tmp_path: Path,
) -> None:  # fmt: skip
    export = engine_registry.export_vllm(DEPLOYMENT)
    args = export["args"]
    assert args[args.index("--model") + 1] == "tiny/target-v1"
    assert args[args.index("--revision") + 1] == hub_pair.target_commit
    assert args[args.index("--tokenizer-revision") + 1] == hub_pair.target_commit
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "tiny/draft",
                    "revision": hub_pair.draft_commit, "num_speculative_tokens": K}  # fmt: skip
    # the Hub's branch moves on after registration: the export must not follow it
    hub_pair.server.update_branch("tiny/draft", {"config.json": b"{}"})
    before = len(hub_pair.server.requests)
    env = {
        "HF_ENDPOINT": hub_pair.server.endpoint,
        "HF_HOME": str(tmp_path / "engine-hf-home"),  # an empty cache: vLLM must download
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    engines.stop()
    engines.serve(DEPLOYMENT, env=env)
    _check_serves(engines, DEPLOYMENT, "def add(a, b):")
    paths = [path for _, path in hub_pair.server.requests[before:]]
    got = [p for p in paths if "/resolve/" in p]
    assert any(f"/tiny/target-v1/resolve/{hub_pair.target_commit}/" in p for p in got), paths
    assert any(f"/tiny/draft/resolve/{hub_pair.draft_commit}/" in p for p in got), paths
    assert not [p for p in paths if "/resolve/main/" in p or "/revision/main" in p], paths
