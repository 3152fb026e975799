"""`audit fetch-weights`: download the bundle's exact Hub commits and re-hash them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from registry.db import session_scope
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from registry.services import requests as svc
from registry.settings import Settings
from tests.fixtures import byte_tokenizer_json
from tests.hubserver import hub_server  # noqa: F401 - pytest fixture
from tests.requests.conftest import ACTOR, promote_at

runner = CliRunner()


def _files(weights: bytes) -> dict[str, bytes]:
    config = {"model_type": "llama", "hidden_size": 64, "vocab_size": 258}
    return {
        "config.json": json.dumps(config).encode(),
        "tokenizer.json": json.dumps(byte_tokenizer_json()).encode(),
        "model.safetensors": weights,
    }


def test_fetch_weights_downloads_exact_commits(
    home: Settings,
    hub_server,  # noqa: F811 - pytest fixture
    tmp_path: Path,
) -> None:
    hub_server.add_repo("acme/target", _files(b"T" * 4096), lfs_paths={"model.safetensors"})
    hub_server.add_repo("acme/draft", _files(b"D" * 2048), lfs_paths={"model.safetensors"})
    url = home.db_url
    with session_scope(url) as s:
        t = art_svc.add_artifact(s, source="hf://acme/target@main", name="acme/target",
                                 role="target", actor=ACTOR).artifact  # fmt: skip
        d = art_svc.add_artifact(s, source="hf://acme/draft@main", name="acme/draft",
                                 role="draft", actor=ACTOR).artifact  # fmt: skip
        pair = pair_svc.register_pair(s, target=t.ref, draft=d.ref, method="draft_model", k=4,
                                      actor=ACTOR).pair  # fmt: skip
    live_from = datetime.now(UTC) - timedelta(minutes=10)
    promote_at(url, "prod", pair.pair_digest, live_from)
    with session_scope(url) as s:
        svc.ingest_requests(s, tags=[{"request_id": "r-1", "deployment": "prod",
                                      "served_at": datetime.now(UTC).isoformat()}],
                            actor=ACTOR)  # fmt: skip
    bundle = tmp_path / "bundle.json"
    made = runner.invoke(app, ["audit", "bundle", "r-1", "-o", str(bundle)])
    assert made.exit_code == 0, made.output

    # Branch moves after the fact: the bundle still pins the commits that served r-1.
    hub_server.update_branch("acme/target", _files(b"X" * 4096))
    fresh_cache = tmp_path / "auditor-cache"
    got = runner.invoke(app, ["audit", "fetch-weights", str(bundle), "--cache-dir",
                              str(fresh_cache), "--json"])  # fmt: skip
    assert got.exit_code == 0, got.output
    report = json.loads(got.stdout)
    assert [r["role"] for r in report] == ["target", "drafter"]
    assert all(r["ok"] for r in report)
    snapshot = Path(report[0]["path"])
    assert snapshot.name == t.hub_commit and snapshot.is_relative_to(fresh_cache)
    assert (snapshot / "model.safetensors").read_bytes() == b"T" * 4096

    checked = runner.invoke(app, ["audit", "verify-bundle", str(bundle), "--weights",
                                  f"target={snapshot}", "--public-key",
                                  str(home.public_key_path)])  # fmt: skip
    assert checked.exit_code == 0, checked.output
