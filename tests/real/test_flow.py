"""The governance flow on the real pair, through the real CLI (embedded registry):

register target-v1 and its draft (provenance: trained against target-v1's digest) → pair →
validate → promote → target-v2 registered in the same lineage (a target change) → the
worker measures the candidate → drift flag on `code` → promoting the candidate is refused
→ draft-v2 (trained against target-v2) registered → its pair validates and is promoted.

α relations, not values: target-v2 with the old draft is below target-v1 on `code` beyond
the flag's interval; draft-v2 restores `code`; `creative` moves far less than `code`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from runner.real import read_build_manifest

pytestmark = [
    pytest.mark.real,
    # Known gap, not a pass: with recipe real-5 the draft's greedy α on target-v1 is too low
    # (raw suite, 10 prompts per category, 24 tokens: code 0.205, creative 0.290, overall
    # 0.236) for the policy's floors, so validation fails at the first step, and target-v2
    # lowers `creative` about as much as `code`. Not run until the recipe reaches the floors.
    pytest.mark.xfail(run=False, reason="real-5 draft α below the policy floors (0.24 overall)"),
]
POLICY = Path(__file__).with_name("policy_real.toml")
LINEAGE = "smollm2/instruct"


def _add(cli: Any, path: str, name: str, role: str, prov: dict[str, str]) -> dict:
    args = ["artifact", "add", path, "--name", name, "--role", role, "--json"]
    for key, value in sorted(prov.items()):
        args += [f"--{key.replace('_', '-')}", value]
    r = cli(*args)
    assert r.rc == 0, r.err
    return r.json()


def _pair(cli: Any, target: str, draft: str) -> dict:
    r = cli("pair", "register", "--target", target, "--draft", draft,
            "--method", "draft_model", "--k", "4", "--json")  # fmt: skip
    assert r.rc == 0, r.err
    return r.json()["pair"]


def _alpha(cli: Any, measurement_id: int) -> dict[str, float]:
    m = cli("measurement", "show", str(measurement_id), "--json").json()
    return {"overall": m["alpha"], **{c: v["alpha"] for c, v in m["categories"].items()}}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # one dialect: minutes per run
def test_real_pair_drift_and_maintenance(home, cli, real, no_mlflow) -> None:  # type: ignore[no-untyped-def]
    prov = read_build_manifest(real.root)["provenance"]
    _add(cli, real.target_v1, LINEAGE, "target", prov["target-v1"])
    draft = _add(cli, real.draft, "smollm2/draft", "draft", prov["draft"])
    assert (
        draft["artifact"]["provenance"]["trained_against"]
        == (read_build_manifest(real.root)["manifest_digests"]["target-v1"])
    )
    pair = _pair(cli, f"{LINEAGE}@v1", "smollm2/draft@v1")
    assert pair["warnings"] == []  # the draft's recorded target is this target
    assert cli("policy", "put", str(POLICY)).rc == 0
    assert cli("deployment", "create", "chat-prod", "--policy", "real").rc == 0
    r = cli("validate", pair["pair_digest"], "--deployment", "chat-prod", "--json")
    assert r.rc == 0, r.out + r.err
    val = r.json()
    assert val["passed"], val["gates"]
    a_v1 = _alpha(cli, val["measurement_id"])
    assert cli("promote", pair["pair_digest"], "--deployment", "chat-prod",
               "--reason", "first release").rc == 0  # fmt: skip

    # the target moves: target-v2 in the same lineage
    r = cli("artifact", "add", real.target_v2, "--name", LINEAGE, "--role", "target", "--json")
    assert r.rc == 0 and r.json()["target_changed"] is True, r.err
    queued = cli("jobs", "list", "--state", "queued", "--json").json()["items"]
    assert len(queued) == 1 and queued[0]["args"]["drift"]
    candidate = queued[0]["args"]["pair_digest"]
    assert cli("worker", "--once", "--lease", "600").rc == 0
    job = cli("jobs", "show", str(queued[0]["id"]), "--json").json()
    assert job["state"] == "done", job
    a_v2 = _alpha(cli, job["result"]["measurement_id"])
    flags = cli("drift", "list", "--state", "open", "--json").json()["items"]
    assert len(flags) == 1 and flags[0]["pair_digest"] == candidate
    effects = flags[0]["effects"]["categories"]
    code, creative = effects["code"], effects["creative"]
    sys.__stderr__.write(
        f"\nreal pair α v1/draft {a_v1}\n  v2/draft {a_v2}\n  code diff {code['diff']:+.3f} "
        f"CI [{code['ci_low']:+.3f}, {code['ci_high']:+.3f}] p_holm {code['p_holm']:.4f}; "
        f"creative diff {creative['diff']:+.3f} drifted {creative['drifted']}\n"
    )
    assert code["drifted"] and code["ci_high"] < 0 and code["p_holm"] < 0.05
    assert a_v2["code"] < a_v1["code"]
    assert abs(creative["diff"]) < abs(code["diff"]) / 2  # the move is confined to code
    assert cli("pair", "show", candidate, "--json").json()["status"] == "drifted"
    r = cli("promote", candidate, "--deployment", "chat-prod", "--reason", "v2")
    assert r.rc == 2 and "flags" in r.err

    # maintenance: draft-v2, trained against target-v2, restores code acceptance
    draft2 = _add(cli, real.draft_v2, "smollm2/draft", "draft", prov["draft-v2"])
    assert draft2["artifact"]["version"] == 2
    pair2 = _pair(cli, f"{LINEAGE}@v2", "smollm2/draft@v2")
    assert pair2["warnings"] == []
    r = cli("validate", pair2["pair_digest"], "--deployment", "chat-prod", "--json")
    assert r.rc == 0, r.out + r.err
    val2 = r.json()
    assert val2["passed"], val2["gates"]
    a_v2d2 = _alpha(cli, val2["measurement_id"])
    sys.__stderr__.write(f"  v2/draft-v2 {a_v2d2}\n")
    assert a_v2d2["code"] > a_v2["code"] + (a_v1["code"] - a_v2["code"]) / 2
    r = cli("promote", pair2["pair_digest"], "--deployment", "chat-prod",
            "--reason", "draft re-distilled for v2")  # fmt: skip
    assert r.rc == 0, r.err
    dep = cli("deployment", "show", "chat-prod", "--json").json()
    assert dep["current_pair_digest"] == pair2["pair_digest"]
    assert cli("audit", "verify").rc == 0
