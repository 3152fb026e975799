"""The audit log (an RFC 6962 Merkle tree with C2SP checkpoints): independent
recomputation, tampering, checkpoints, and the PostgreSQL append-only triggers."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from registry.db import get_engine, session_scope
from registry.records.core import Provenance
from registry.services.artifacts import add_artifact
from registry.services.pairs import register_pair
from registry.services.tokens import create_token
from registry.settings import Settings
from registry.trust import audit, audit_tree
from tests.api.conftest import ApiEnv, run_cli
from tests.fixtures import bypass_append_only, write_fake_model


def _populate(settings: Settings, tmp_path: Path) -> None:
    target = write_fake_model(tmp_path / "t")
    draft = write_fake_model(tmp_path / "d", hidden_size=32, weights=b"draft")
    with session_scope(settings.db_url) as s:
        add_artifact(
            s,
            source=str(target),
            name="acme/t",
            role="target",
            provenance=Provenance(publisher="acme"),
            actor="local:alice",
        )
        add_artifact(s, source=str(draft), name="acme/d", role="draft", actor="local:alice")
        register_pair(
            s, target="acme/t@v1", draft="acme/d@v1", method="draft_model", k=4, actor="local:bob"
        )
        create_token(s, name="ops", role="reader", actor="local:alice")


def _root(events: list[dict]) -> str:
    """The documented algorithm, with nothing but the standard library: each leaf is
    SHA-256(0x00 || canonical JSON of the event body), nodes SHA-256(0x01 || left || right),
    split at the largest power of two below the size (RFC 6962 §2.1)."""

    def leaf(e: dict) -> bytes:
        body = {k: e[k] for k in ("seq", "occurred_at", "actor", "action", "entity_type")}
        body |= {"entity_id": e["entity_id"], "payload": e["payload"]}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
        return hashlib.sha256(b"\x00" + canonical).digest()

    def mth(leaves: list[bytes]) -> bytes:
        if len(leaves) == 1:
            return leaves[0]
        k = 1
        while k * 2 < len(leaves):
            k *= 2
        return hashlib.sha256(b"\x01" + mth(leaves[:k]) + mth(leaves[k:])).digest()

    return mth([leaf(e) for e in events]).hex()


def test_log_recomputes_from_the_documented_form(api: ApiEnv, tmp_path: Path) -> None:
    _populate(api.settings, tmp_path)
    events = api.client.get(
        "/v1/audit/events", params={"limit": 500}, headers=api.auth("auditor")
    ).json()["items"]
    actions = [e["action"] for e in events]
    assert actions.count("artifact.added") == 2 and "pair.registered" in actions
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert "chain_hash" not in events[0] and "prev_hash" not in events[0]
    verdict = api.client.get("/v1/audit/verify", headers=api.auth("auditor")).json()
    assert verdict == {
        "ok": True,
        "tree_size": len(events),
        "root_hash": _root(events),
        "first_bad_seq": None,
        "reason": None,
        "signed_size": None,
        "signed_ok": True,
        "signed_detail": "no checkpoint signed yet: nothing to compare with",
        "verified_from": 0,
        "checkpoint_size": None,
        "checkpoint_ok": None,
        "checkpoint_detail": None,
    }
    # every mutation names its actor
    pair_event = next(e for e in events if e["action"] == "pair.registered")
    assert pair_event["actor"] == "local:bob" and pair_event["entity_type"] == "pair"


def test_sqlite_payload_tamper_names_the_sequence(sqlite_home: Settings, tmp_path: Path) -> None:
    _populate(sqlite_home, tmp_path)
    ok = run_cli("audit", "verify")
    assert ok.exit_code == 0 and "log intact" in ok.output
    with get_engine(sqlite_home.db_url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(
            text("UPDATE audit_events SET payload = :p WHERE seq = 3"),
            {"p": json.dumps({"lineage": "evil/model", "version": 1})},
        )
    broken = run_cli("audit", "verify")
    assert broken.exit_code == 1
    assert "BROKEN at sequence 3" in broken.output
    as_json = run_cli("audit", "verify", "--json")
    assert as_json.exit_code == 1
    report = json.loads(as_json.output)
    assert report["ok"] is False and report["first_bad_seq"] == 3

    # An earlier, subtler edit (the actor) is found first.
    with get_engine(sqlite_home.db_url).begin() as conn:
        conn.execute(text("UPDATE audit_events SET actor = 'local:mallory' WHERE seq = 2"))
    assert json.loads(run_cli("audit", "verify", "--json").output)["first_bad_seq"] == 2


def test_checkpoint_catches_a_truncated_tail_and_a_forged_note(
    sqlite_home: Settings, tmp_path: Path
) -> None:
    key = sqlite_home.signing_key_path
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    _populate(sqlite_home, tmp_path)
    cp_file = tmp_path / "cp.txt"
    made = run_cli("audit", "checkpoint", "-o", str(cp_file))
    assert made.exit_code == 0, made.output
    size = int(cp_file.read_text().splitlines()[1])
    assert size >= 4

    with session_scope(sqlite_home.db_url) as s:  # the log grows after the checkpoint
        create_token(s, name="later", role="reader", actor="local:alice")
    good = run_cli("audit", "verify", "--checkpoint", str(cp_file))
    assert good.exit_code == 0 and "checkpoint ok" in good.output

    # Truncation with the tree cut to match leaves a valid, smaller log: the checkpoints
    # (the one given, and the log's own) notice.
    with get_engine(sqlite_home.db_url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(text("DELETE FROM audit_leaves WHERE idx >= :i"), {"i": size - 1})
        conn.execute(text("DELETE FROM audit_pending"))
        conn.execute(text("DELETE FROM audit_events WHERE seq >= :s"), {"s": size})
        audit_tree.rebuild(conn)
    cut = run_cli("audit", "verify", "--checkpoint", str(cp_file))
    assert cut.exit_code == 1
    said = " ".join(cut.output.split())
    assert f"checkpoint covers {size} events, the log has only {size - 1}" in said
    assert "events were removed" in said

    # Forging the note breaks its signature: refused as invalid input (exit 2).
    lines = cp_file.read_text().split("\n")
    lines[1] = str(size - 1)
    forged_file = tmp_path / "forged.txt"
    forged_file.write_text("\n".join(lines))
    refused = run_cli("audit", "verify", "--checkpoint", str(forged_file))
    assert refused.exit_code == 2 and "does not verify" in refused.output


def test_checkpoint_over_http(api: ApiEnv, tmp_path: Path) -> None:
    _populate(api.settings, tmp_path)
    cp = api.client.post("/v1/audit/log-checkpoints", headers=api.auth("auditor"))
    assert cp.status_code == 200, cp.text
    checkpoint = cp.json()
    verdict = api.client.post(
        "/v1/audit/verify", json={"checkpoint": checkpoint["note"]}, headers=api.auth("auditor")
    ).json()
    assert verdict["ok"] is True and verdict["checkpoint_ok"] is True
    assert verdict["tree_size"] == checkpoint["tree_size"] == verdict["signed_size"]
    forged = checkpoint["note"].replace(f"\n{checkpoint['tree_size']}\n", "\n1\n", 1)
    resp = api.client.post(
        "/v1/audit/verify", json={"checkpoint": forged}, headers=api.auth("auditor")
    )
    assert resp.status_code == 422 and resp.json()["field"] == "checkpoint"
    for role in ("reader", "registrar", "promoter"):
        denied = api.client.post("/v1/audit/log-checkpoints", headers=api.auth(role))
        assert denied.status_code == 403, role


@pytest.mark.postgres
def test_postgres_refuses_update_delete_truncate(pg_url: str, tmp_path: Path) -> None:
    with session_scope(pg_url) as s:
        create_token(s, name="a", role="reader", actor="local:alice")
        create_token(s, name="b", role="reader", actor="local:alice")
    engine = get_engine(pg_url)
    for statement in (
        "UPDATE audit_events SET payload = '{}' WHERE seq = 1",
        "DELETE FROM audit_events WHERE seq = 2",
        "TRUNCATE audit_events",
    ):
        with pytest.raises(DBAPIError, match="append-only"):
            with engine.begin() as conn:
                conn.execute(text(statement))
    with session_scope(pg_url) as s:
        audit.integrate(s)  # integrate before read
        report = audit_tree.verify_tree(s)
    assert report.ok and report.size == 2
