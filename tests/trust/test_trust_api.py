"""The transparency and retention operations over HTTP (routes follow from the contract)."""

from __future__ import annotations

from pathlib import Path

from registry.trust import merkle, signed_note
from registry.trust.witness import Witness
from tests.api.conftest import ApiEnv


def test_proofs_checkpoints_witness_and_retention_over_http(api: ApiEnv, tmp_path: Path) -> None:
    c, auditor = api.client, api.auth("auditor")
    for name in ("a", "b", "c"):  # a few audit events
        assert c.post(
            "/v1/tokens", json={"name": name, "role": "reader"}, headers=api.auth()
        ).is_success
    first = c.post("/v1/audit/log-checkpoints", headers=auditor)
    assert first.status_code in (200, 201), first.text
    cp = first.json()
    log = signed_note.Verifier.parse(cp["verifier_key"])
    opened, _ = signed_note.open_checkpoint(cp["note"], log)
    assert opened.size == cp["tree_size"] >= 4
    assert c.get("/v1/audit/log-checkpoints/latest", headers=auditor).json()["note"] == cp["note"]

    proof = c.get(
        "/v1/audit/proofs/inclusion",
        params={"seq": 2, "tree_size": cp["tree_size"]},
        headers=auditor,
    ).json()
    assert merkle.verify_inclusion(
        merkle.leaf_hash(proof["leaf_data"].encode()),
        1,
        cp["tree_size"],
        [bytes.fromhex(h) for h in proof["path"]],
        opened.root,
    )
    bad = c.get("/v1/audit/proofs/inclusion", params={"seq": 0}, headers=auditor)
    assert bad.status_code == 422 and bad.json()["field"] == "seq"
    assert (
        c.get(
            "/v1/audit/proofs/inclusion", params={"seq": 2}, headers=api.auth("reader")
        ).status_code
        == 403
    )

    witness = Witness(
        name="witness.example/http",
        key_path=tmp_path / "w.key",
        state_path=tmp_path / "w.state",
        log_key=cp["verifier_key"],
    )

    def prove(old: int, new: int) -> list[bytes]:
        r = c.get(
            "/v1/audit/proofs/consistency",
            params={"old_size": old, "new_size": new},
            headers=auditor,
        )
        return [bytes.fromhex(h) for h in r.json()["path"]]

    witness.cosign(cp["note"], prove)
    assert c.post("/v1/tokens", json={"name": "d", "role": "reader"}, headers=api.auth()).is_success
    later = c.post("/v1/audit/log-checkpoints", headers=auditor).json()
    assert later["tree_size"] == cp["tree_size"] + 1
    assert "consistent with" in witness.cosign(later["note"], prove).detail

    verdict = c.post("/v1/audit/verify", json={"checkpoint": cp["note"]}, headers=auditor).json()
    assert verdict["ok"] and verdict["checkpoint_ok"] and verdict["tree_size"] == later["tree_size"]
    forged = c.post(
        "/v1/audit/verify",
        json={"checkpoint": cp["note"].replace("\n\n", "\nx\n\n", 1)},
        headers=auditor,
    )
    assert forged.status_code == 422 and forged.json()["field"] == "checkpoint"

    assert c.get("/v1/retention", headers=auditor).json()["months"] == 6
    low = c.put("/v1/retention", json={"kind": "request_tags", "months": 5}, headers=api.auth())
    assert low.status_code == 422 and low.json()["field"] == "months"
    assert (
        c.put(
            "/v1/retention", json={"kind": "request_tags", "months": 5}, headers=auditor
        ).status_code
        == 403
    )
    up = c.put("/v1/retention", json={"kind": "request_tags", "months": 9}, headers=api.auth())
    assert up.status_code == 200 and up.json()["months"] == 9
