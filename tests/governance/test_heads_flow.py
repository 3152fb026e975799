"""Governance for head-based pairs: the drift flow runs for an EAGLE-3 tree pair exactly as
for a draft model, and a target change the heads cannot follow (hidden size, layer count) is
an integrity finding on the pair, not a crash or a doomed measurement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from registry.db import session_scope
from registry.governance import lifecycle
from registry.services import artifacts, pairs
from registry.tables import AuditEvent, DriftFlag, Job, Pair
from tests.fixtures import write_fake_model
from tests.governance.conftest import POLICY

ACTOR = "tester"
TREE = {"kind": "dynamic", "top_k": 3, "total_tokens": 8}


def _head_dir(path: Path, layers: list[int]) -> Path:
    path.mkdir(parents=True)
    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": 32,
        "eagle_aux_hidden_state_layer_ids": layers,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "acme/t", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": {
            "model_type": "llama",
            "hidden_size": 64,
            "vocab_size": 258,
            "num_hidden_layers": 1,
        },  # fmt: skip
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"heads")
    return path


def _add(url: str, path: Path, name: str, role: str) -> Any:
    with session_scope(url) as s:
        return artifacts.add_artifact(s, source=str(path), name=name, role=role, actor=ACTOR)


@pytest.mark.parametrize(
    "change,needle",
    [
        ({"hidden_size": 80}, "hidden size mismatch: heads read 64, target has 80"),
        ({"num_hidden_layers": 3}, "layer count mismatch"),
    ],
)
def test_target_change_that_no_longer_fits_the_heads_is_an_integrity_finding(
    home: Any, tmp_path: Path, change: dict[str, int], needle: str
) -> None:
    url = home.db_url
    base = {"num_hidden_layers": 8}
    _add(url, write_fake_model(tmp_path / "t1", config_extra=base), "acme/t", "target")
    _add(url, _head_dir(tmp_path / "h", [1, 4, 6]), "acme/h", "heads")
    with session_scope(url) as s:
        pair = pairs.register_pair(
            s, target="acme/t@v1", draft="acme/h@v1", method="eagle3", k=3,
            options={"tree": TREE}, actor=ACTOR,
        ).pair  # fmt: skip
        assert pair.warnings == []
        row = s.get(Pair, pair.id)
        lifecycle.apply(s, row, "validated", actor=ACTOR, reason="test")
    new = write_fake_model(
        tmp_path / "t2", weights=b"v2", hidden_size=change.get("hidden_size", 64),
        config_extra={**base, **{k: v for k, v in change.items() if k != "hidden_size"}},
    )  # fmt: skip
    res = _add(url, new, "acme/t", "target")  # the target change itself must not fail
    assert res.target_changed
    with session_scope(url) as s:
        flags = list(s.scalars(select(DriftFlag)))
        assert len(flags) == 1
        flag = flags[0]
        assert (flag.kind, flag.pair_id, flag.state) == ("integrity", pair.id, "open")
        assert needle in flag.summary and "acme/t@v2" in flag.summary
        assert flag.effects["new_target_id"] == res.artifact.id
        assert list(s.scalars(select(Job))) == []  # nothing doomed was queued
        refused = s.scalars(
            select(AuditEvent).where(AuditEvent.action == "drift.candidate_refused")
        ).all()
        assert len(refused) == 1 and needle in str(refused[0].payload)
    # the same change seen again (e.g. re-registered) does not open a second flag
    with session_scope(url) as s:
        from registry.services.drift import on_target_change
        from registry.tables import Artifact

        prev, cur = s.get(Artifact, pair.target.id), s.get(Artifact, res.artifact.id)
        on_target_change(s, prev, cur, ACTOR)
        assert len(list(s.scalars(select(DriftFlag)))) == 1


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_drift_flow_runs_for_an_eagle3_tree_pair(home, cli, tiny, no_mlflow) -> None:  # type: ignore[no-untyped-def]
    for path, name, role in (
        (tiny.target_v1, "tiny/target-v1", "target"),
        (tiny.eagle3, "tiny/eagle3", "heads"),
    ):
        r = cli("artifact", "add", path, "--name", name, "--role", role, "--json")
        assert r.rc == 0, r.err
    r = cli("pair", "register", "--target", "tiny/target-v1@v1", "--draft", "tiny/eagle3@v1",
            "--method", "eagle3", "--k", "4", "--set", f"tree={json.dumps(TREE)}",
            "--json")  # fmt: skip
    assert r.rc == 0, r.err
    pair = r.json()["pair"]
    assert pair["warnings"] == [] and pair["config"]["tree"] == TREE
    digest = pair["pair_digest"]
    assert cli("policy", "put", str(POLICY)).rc == 0
    assert cli("deployment", "create", "prod", "--policy", "tiny").rc == 0
    r = cli("validate", digest, "--deployment", "prod", "--json")
    assert r.rc == 0, r.out + r.err
    val = r.json()
    assert val["passed"], val
    m = cli("measurement", "show", str(val["measurement_id"]), "--json").json()
    assert m["settings"]["tree"] == TREE and m["settings"]["method"] == "eagle3"
    assert cli("promote", digest, "--deployment", "prod", "--reason", "heads v1").rc == 0

    r = cli("artifact", "add", tiny.target_v2, "--name", "tiny/target-v1", "--role", "target",
            "--json")  # fmt: skip
    assert r.rc == 0 and r.json()["target_changed"] is True
    queued = cli("jobs", "list", "--state", "queued", "--json").json()["items"]
    assert len(queued) == 1 and queued[0]["args"]["drift"]
    candidate = queued[0]["args"]["pair_digest"]
    assert queued[0]["args"]["settings"]["tree"] == TREE
    r = cli("worker", "--once", "--lease", "60")
    assert r.rc == 0, r.err
    job = cli("jobs", "show", str(queued[0]["id"]), "--json").json()
    assert job["state"] == "done", job
    with session_scope(home.db_url) as s:
        flags = list(s.scalars(select(DriftFlag)))
        clean = list(s.scalars(select(AuditEvent).where(AuditEvent.action == "drift.clean")))
        # the paired comparison ran: either a drift flag on the candidate or a clean verdict
        assert len(flags) + len(clean) == 1
        if flags:
            assert flags[0].kind == "drift"
            assert flags[0].pair_id == s.scalar(
                select(Pair.id).where(Pair.pair_digest == candidate)
            )
