"""The whole governance flow with the tiny reference pairs, through the real CLI (embedded).

register target-v1, draft, pair → validate → promote to prod → register target-v2 in the
same lineage → candidate pair + queued job → worker measures it → drift flag on `code` →
promoting the candidate is refused → ack (audited) → promotion goes through. A no-op change
(same weights plus a README) raises no flag. Unchanged pair, sampled with different seeds:
flags stay within the policy's significance level.
"""

from __future__ import annotations

import shutil
import sys
from typing import Any

import pytest
from sqlalchemy import select

from registry.db import session_scope
from registry.tables import AuditEvent
from tests.governance.conftest import POLICY

pytestmark = pytest.mark.slow


def _register(cli: Any, target: str, draft: str) -> str:
    r = cli("artifact", "add", target, "--name", "tiny/target-v1", "--role", "target", "--json")
    assert r.rc == 0, r.err
    r = cli("artifact", "add", draft, "--name", "tiny/draft", "--role", "draft", "--json")
    assert r.rc == 0, r.err
    r = cli(
        "pair",
        "register",
        "--target",
        "tiny/target-v1@v1",
        "--draft",
        "tiny/draft@v1",
        "--method",
        "draft_model",
        "--k",
        "4",
        "--json",
    )
    assert r.rc == 0, r.err
    pair = r.json()["pair"]
    assert pair["warnings"] == []  # the draft declares tiny/target-v1: it matches
    return pair["pair_digest"]


def _validate_and_promote(cli: Any, digest: str) -> dict:
    assert cli("policy", "put", str(POLICY)).rc == 0
    assert cli("deployment", "create", "prod", "--policy", "tiny").rc == 0
    r = cli("validate", digest, "--deployment", "prod", "--json")
    assert r.rc == 0, r.out + r.err
    val = r.json()
    assert val["passed"] and {g["name"] for g in val["gates"]} >= {
        "alpha.overall",
        "alpha.code",
        "alpha.creative",
        "lossless",
        "declared_target",
        "flags",
    }
    r = cli("promote", digest, "--deployment", "prod", "--reason", "first release")
    assert r.rc == 0, r.err
    return val


def _audit(url: str, action: str) -> list[AuditEvent]:
    with session_scope(url) as s:
        rows = list(s.scalars(select(AuditEvent).where(AuditEvent.action == action)))
        s.expunge_all()
        return rows


def test_target_change_drift_blocks_promotion_until_ack(home, cli, tiny, no_mlflow) -> None:  # type: ignore[no-untyped-def]
    url = home.db_url
    digest = _register(cli, tiny.target_v1, tiny.draft)
    val = _validate_and_promote(cli, digest)
    r = cli("measurement", "show", str(val["measurement_id"]), "--json")
    v1 = r.json()

    r = cli(
        "artifact", "add", tiny.target_v2, "--name", "tiny/target-v1", "--role", "target", "--json"
    )
    assert r.rc == 0 and r.json()["target_changed"] is True
    queued = cli("jobs", "list", "--state", "queued", "--json").json()["items"]
    assert len(queued) == 1 and queued[0]["args"]["drift"]
    candidate = queued[0]["args"]["pair_digest"]
    assert candidate != digest

    r = cli("worker", "--once", "--lease", "30")
    assert r.rc == 0, r.err
    job = cli("jobs", "show", str(queued[0]["id"]), "--json").json()
    assert job["state"] == "done", job
    flags = cli("drift", "list", "--state", "open", "--json").json()["items"]
    assert len(flags) == 1
    flag = flags[0]
    assert flag["pair_digest"] == candidate and flag["kind"] == "drift"
    code = flag["effects"]["categories"]["code"]
    assert code["drifted"] and code["diff"] < -0.05 and code["p_holm"] < 0.05
    assert code["ci_high"] < 0
    tf = flag["effects"]["teacher_forced"]
    assert tf["draft_vs_new_target"] < tf["draft_vs_old_target"]
    assert 0 < tf["old_vs_new_target"] < 1
    v2 = cli("measurement", "show", str(job["result"]["measurement_id"]), "--json").json()
    sys.__stderr__.write(
        f"\nα v1 {v1['alpha']:.4f} (code {v1['categories']['code']['alpha']:.4f}); "
        f"α v2 {v2['alpha']:.4f} (code {v2['categories']['code']['alpha']:.4f}); "
        f"code diff {code['diff']:+.4f} CI [{code['ci_low']:+.4f}, {code['ci_high']:+.4f}] "
        f"p {code['p_value']:.4f} Holm {code['p_holm']:.4f}; teacher-forced {tf}\n"
    )
    assert cli("pair", "show", candidate, "--json").json()["status"] == "drifted"

    r = cli("promote", candidate, "--deployment", "prod", "--reason", "v2")
    assert r.rc == 2 and "flags" in r.err and f"#{flag['id']}" in r.err

    r = cli("drift", "ack", str(flag["id"]), "--reason", "v2 is tuned for prose; accepted")
    assert r.rc == 0, r.err
    acks = _audit(url, "drift.flag_acknowledged")
    assert len(acks) == 1 and "accepted" in acks[0].payload

    r = cli("promote", candidate, "--deployment", "prod", "--reason", "v2 after review")
    assert r.rc == 0, r.err
    dep = cli("deployment", "show", "prod", "--json").json()
    assert dep["current_pair_digest"] == candidate
    assert [(e["to_pair_digest"], e["reason"]) for e in dep["history"]] == [
        (digest, "first release"),
        (candidate, "v2 after review"),
    ]
    assert cli("pair", "show", digest, "--json").json()["status"] == "validated"
    r = cli("rollback", "--deployment", "prod", "--reason", "back to v1")
    assert (
        r.rc == 0
        and cli("deployment", "show", "prod", "--json").json()["current_pair_digest"] == digest
    )
    assert cli("audit", "verify").rc == 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_noop_change_raises_no_flag(home, cli, tiny, tmp_path, no_mlflow) -> None:  # type: ignore[no-untyped-def]
    a = tmp_path / "t-a"
    b = tmp_path / "t-b"
    shutil.copytree(tiny.target_v1, a)
    shutil.copytree(tiny.target_v1, b)
    (b / "README.md").write_text("# tiny target\nSame weights, new model card.\n")
    digest = _register(cli, str(a), tiny.draft)
    _validate_and_promote(cli, digest)
    r = cli("artifact", "add", str(b), "--name", "tiny/target-v1", "--role", "target", "--json")
    assert r.rc == 0 and r.json()["target_changed"] is True
    assert cli("worker", "--once").rc == 0
    assert cli("drift", "list", "--json").json()["items"] == []
    assert len(_audit(home.db_url, "drift.clean")) == 1
    jobs = cli("jobs", "list", "--json").json()["items"]
    cand = [j for j in jobs if j["args"].get("drift")][0]
    assert cand["state"] == "done" and cand["result"]["passed"] is True


def test_false_flag_rate_with_sampling(tiny) -> None:  # type: ignore[no-untyped-def]
    """Unchanged pair sampled at temperature 1 with different seeds (bounded run)."""
    from registry.stats.drift import drift_test
    from runner import MeasureSettings, load_suite, measure_pair
    from runner.executor import select_prompts

    prompts = select_prompts(load_suite("default"), ["code", "creative"], 8)
    runs = []
    for seed in range(5):
        s = MeasureSettings(
            method="draft_model", k=4, temperature=1.0, max_new_tokens=24, seed=seed, device="cpu"
        )
        runs.append(measure_pair(tiny.target_v1, tiny.draft, prompts, s).to_dict()["prompts"])
    flags = 0
    comparisons = 0
    for i in range(1, len(runs)):
        eff = drift_test(runs[0], runs[i], margin=0.05, significance=0.05, n_boot=1000)
        flags += any(e.drifted for e in eff.values())
        comparisons += 1
    # 4 comparisons at a 5% family-wise level: more than one flag has probability < 2%.
    assert flags <= 1, flags
