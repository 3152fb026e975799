"""The hash-chained audit log: independent recomputation, tampering, checkpoints, and the
PostgreSQL append-only triggers."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from registry import audit
from registry.db import get_engine, session_scope
from registry.records import Provenance
from registry.services.artifacts import add_artifact
from registry.services.pairs import register_pair
from registry.services.tokens import create_token
from registry.settings import Settings
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


def _recompute(events: list[dict]) -> str:
    """The documented algorithm, with nothing but the standard library."""
    prev = "0" * 64
    for e in events:
        body = {
            "seq": e["seq"],
            "occurred_at": e["occurred_at"],
            "actor": e["actor"],
            "action": e["action"],
            "entity_type": e["entity_type"],
            "entity_id": e["entity_id"],
            "payload": e["payload"],
        }
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
        assert e["prev_hash"] == prev
        prev = hashlib.sha256(bytes.fromhex(prev) + canonical).hexdigest()
        assert prev == e["chain_hash"], f"sequence {e['seq']}"
    return prev


def test_chain_recomputes_from_the_documented_form(api: ApiEnv, tmp_path: Path) -> None:
    _populate(api.settings, tmp_path)
    events = api.client.get(
        "/v1/audit/events", params={"limit": 500}, headers=api.auth("auditor")
    ).json()["items"]
    actions = [e["action"] for e in events]
    assert actions.count("artifact.added") == 2 and "pair.registered" in actions
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    head = _recompute(events)
    verdict = api.client.get("/v1/audit/verify", headers=api.auth("auditor")).json()
    assert verdict == {
        "ok": True,
        "count": len(events),
        "head_seq": len(events),
        "head_hash": head,
        "first_broken_seq": None,
        "reason": None,
        "signed_size": None,
        "signed_ok": True,
        "signed_detail": "no checkpoint signed yet: nothing to compare with",
        "checkpoint_ok": None,
        "checkpoint_detail": None,
    }
    # every mutation names its actor
    pair_event = next(e for e in events if e["action"] == "pair.registered")
    assert pair_event["actor"] == "local:bob" and pair_event["entity_type"] == "pair"


def test_sqlite_payload_tamper_names_the_sequence(sqlite_home: Settings, tmp_path: Path) -> None:
    _populate(sqlite_home, tmp_path)
    ok = run_cli("audit", "verify")
    assert ok.exit_code == 0 and "chain intact" in ok.output
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
    assert report["ok"] is False and report["first_broken_seq"] == 3 and report["count"] == 2

    # An earlier, subtler edit (the actor) is found first.
    with get_engine(sqlite_home.db_url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(text("UPDATE audit_events SET actor = 'local:mallory' WHERE seq = 2"))
    assert json.loads(run_cli("audit", "verify", "--json").output)["first_broken_seq"] == 2


def test_checkpoint_catches_a_truncated_or_rewritten_tail(
    sqlite_home: Settings, tmp_path: Path
) -> None:
    key = sqlite_home.signing_key_path
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    _populate(sqlite_home, tmp_path)
    cp_file = tmp_path / "cp.json"
    made = run_cli("audit", "checkpoint", "-o", str(cp_file))
    assert made.exit_code == 0, made.output
    cp = json.loads(cp_file.read_text())
    assert cp["algorithm"] == "ed25519" and cp["seq"] >= 4
    assert cp["public_key"] == sqlite_home.public_key_path.read_text()

    with session_scope(sqlite_home.db_url) as s:  # the log grows after the checkpoint
        create_token(s, name="later", role="reader", actor="local:alice")
    good = run_cli("audit", "verify", "--checkpoint", str(cp_file))
    assert good.exit_code == 0 and "checkpoint ok" in good.output

    # Truncation leaves a valid chain prefix; the Merkle tree over the same events notices,
    # and so does the checkpoint.
    with get_engine(sqlite_home.db_url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(text("DELETE FROM audit_events WHERE seq >= :s"), {"s": cp["seq"]})
    plain = run_cli("audit", "verify")
    assert plain.exit_code == 1 and "chain intact" in plain.output
    assert "signed checkpoints DIVERGED: the Merkle tree" in " ".join(plain.output.split())
    cut = run_cli("audit", "verify", "--checkpoint", str(cp_file))
    assert cut.exit_code == 1
    assert f"checkpointed sequence {cp['seq']} is missing" in cut.output

    # Forging the checkpoint file breaks its signature: refused as invalid input (exit 2).
    forged = dict(cp, chain_hash="f" * 64)
    forged_file = tmp_path / "forged.json"
    forged_file.write_text(json.dumps(forged))
    refused = run_cli("audit", "verify", "--checkpoint", str(forged_file))
    assert refused.exit_code == 2 and "signature does not verify" in refused.output


def test_rewritten_history_with_recomputed_hashes_fails_the_checkpoint(
    sqlite_home: Settings, tmp_path: Path
) -> None:
    _populate(sqlite_home, tmp_path)
    cp_file = tmp_path / "cp.json"
    assert run_cli("audit", "checkpoint", "-o", str(cp_file)).exit_code == 0
    # A database superuser rewrites an event and recomputes every later hash.
    with session_scope(sqlite_home.db_url) as s:
        from registry.models import AuditEvent

        bypass_append_only(s.connection())
        events = s.query(AuditEvent).order_by(AuditEvent.seq).all()
        events[1].payload = json.dumps({"lineage": "evil/model"})
        prev = audit.GENESIS_HASH
        for e in events:
            e.prev_hash = prev
            e.chain_hash = prev = audit.chain_step(prev, audit.event_body(e))
    # The chain is fooled, but not the Merkle tree over the same events.
    plain = run_cli("audit", "verify")
    assert plain.exit_code == 1 and "chain intact" in plain.output
    said = " ".join(plain.output.split())
    assert "tree over the same events does not verify at sequence 2" in said
    result = run_cli("audit", "verify", "--checkpoint", str(cp_file))
    assert result.exit_code == 1 and "differs from the checkpoint" in result.output


def test_checkpoint_over_http(api: ApiEnv, tmp_path: Path) -> None:
    _populate(api.settings, tmp_path)
    cp = api.client.post("/v1/audit/checkpoint", headers=api.auth("auditor"))
    assert cp.status_code == 200, cp.text
    checkpoint = cp.json()
    pub = api.settings.public_key_path.read_text()
    assert checkpoint["public_key"] == pub
    verdict = api.client.post(
        "/v1/audit/verify", json={"checkpoint": checkpoint}, headers=api.auth("auditor")
    ).json()
    assert verdict["ok"] is True and verdict["checkpoint_ok"] is True
    assert verdict["head_seq"] == checkpoint["seq"]
    forged = dict(checkpoint, seq=checkpoint["seq"] + 1)
    resp = api.client.post(
        "/v1/audit/verify", json={"checkpoint": forged}, headers=api.auth("auditor")
    )
    assert resp.status_code == 422 and resp.json()["field"] == "checkpoint"


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
        report = audit.verify_chain(s)
    assert report.ok and report.count == 2
