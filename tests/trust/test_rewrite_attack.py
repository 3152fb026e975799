"""An attacker with write access to the database file (or a PostgreSQL superuser) changes an
event's actor and recomputes everything derivable inside the database (then the hash chain,
now retired, and the Merkle tree). ``audit verify`` used to pass after that; now it compares
the log with the checkpoints the log signed and fails, naming the range of events that
changed."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text

from registry.db import get_engine, session_scope
from registry.services import transparency as tl
from registry.services.tokens import create_token
from registry.settings import Settings
from registry.trust import audit_tree
from tests.api.conftest import run_cli
from tests.fixtures import bypass_append_only


def _grow(url: str, names: list[str]) -> None:
    with session_scope(url) as s:
        for name in names:
            create_token(s, name=name, role="reader", actor="local:alice")


def rewrite_actor(url: str, seq: int, actor: str) -> None:
    """Change one event's actor, then rebuild the tree from the events: every check computed
    from the database alone holds again."""
    with get_engine(url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(
            text("UPDATE audit_events SET actor = :a WHERE seq = :s"), {"a": actor, "s": seq}
        )
    with session_scope(url) as s:
        bypass_append_only(s.connection())
        audit_tree.rebuild(s.connection())


def test_rewritten_actor_with_recomputed_tree_fails_verify(home: Settings) -> None:
    url = home.db_url
    _grow(url, ["a", "b", "c"])
    with session_scope(url) as s:
        first = tl.sign_log_checkpoint(s, actor="local:auditor")
    _grow(url, ["d", "e"])
    with session_scope(url) as s:
        second = tl.sign_log_checkpoint(s, actor="local:auditor")
        assert tl.verify_audit_log(s).signed_ok is True
    ok = run_cli("audit", "verify")
    assert ok.exit_code == 0 and "signed checkpoints ok" in ok.output, ok.output

    # The victim: an event between the two checkpoints.
    victim = first.tree_size + 1
    rewrite_actor(url, victim, "local:mallory")
    with session_scope(url) as s:
        assert audit_tree.verify_tree(s).ok, "the tree alone is fooled"
        tree = tl.verify_audit_log(s)
    assert not tree.ok and tree.signed_ok is False and tree.signed_size == second.tree_size
    want = f"events {first.tree_size + 1}..{second.tree_size} was changed"
    assert want in (tree.signed_detail or ""), tree.signed_detail

    out = run_cli("audit", "verify")
    assert out.exit_code == 1, out.output
    said = " ".join(out.output.split())
    assert "log intact" in said and "signed checkpoints DIVERGED" in said and want in said
    as_json = json.loads(run_cli("audit", "verify", "--json").output)
    assert as_json["ok"] is False and as_json["signed_size"] == second.tree_size

    # And the log refuses to sign over the rewritten history.
    refused = run_cli("audit", "checkpoint")
    assert refused.exit_code == 2 and "refusing to sign a second history" in refused.output


def test_deleting_the_checkpoints_too_is_caught_by_the_copy_outside(home: Settings) -> None:
    url = home.db_url
    _grow(url, ["a", "b"])
    with session_scope(url) as s:
        signed = tl.sign_log_checkpoint(s, actor="local:auditor")
    rewrite_actor(url, 1, "local:mallory")
    with get_engine(url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(text("DELETE FROM log_checkpoints"))
    with session_scope(url) as s:
        tree = tl.verify_audit_log(s)
    assert not tree.ok and tree.signed_size == signed.tree_size
    assert "kept outside the database" in (tree.signed_detail or "")
    assert "events 1.." in (tree.signed_detail or "") or "event 1 " in (tree.signed_detail or "")


def test_a_truncated_log_fails_against_its_signed_checkpoint(home: Settings) -> None:
    url = home.db_url
    _grow(url, ["a", "b", "c"])
    with session_scope(url) as s:
        signed = tl.sign_log_checkpoint(s, actor="local:auditor")
    with get_engine(url).begin() as conn:
        bypass_append_only(conn)
        # The last leaf, its place in the leaf map and its event (here seq = leaf + 1: one
        # writer, nothing rolled back).
        conn.execute(text("DELETE FROM audit_events WHERE seq = :s"), {"s": signed.tree_size})
        conn.execute(text("DELETE FROM audit_leaves WHERE seq = :s"), {"s": signed.tree_size})
        conn.execute(
            text("DELETE FROM audit_tree WHERE level = 0 AND idx = :i"),
            {"i": signed.tree_size - 1},
        )
    with session_scope(url) as s:
        bypass_append_only(s.connection())
        audit_tree.rebuild(s.connection())
    with session_scope(url) as s:
        tree = tl.verify_audit_log(s)
    assert not tree.ok and "events were removed" in (tree.signed_detail or "")


def test_witness_cosignatures_are_checked_where_named(home: Settings, tmp_path: Path) -> None:
    from registry.trust.witness import Witness

    url = home.db_url
    _grow(url, ["a"])
    with session_scope(url) as s:
        cp = tl.sign_log_checkpoint(s, actor="local:auditor")
    w = Witness(
        name="w.example/1",
        key_path=tmp_path / "w.key",
        state_path=tmp_path / "w.state",
        log_key=cp.verifier_key,
    )
    other = Witness(
        name="w.example/2",
        key_path=tmp_path / "o.key",
        state_path=tmp_path / "o.state",
        log_key=cp.verifier_key,
    )
    cosigned = w.cosign(cp.note, lambda old, new: [])
    with session_scope(url) as s:
        good = tl.verify_audit_log(s, checkpoint=cosigned.note, witness_keys=[w.verifier.vkey])
        bad = tl.verify_audit_log(s, checkpoint=cp.note, witness_keys=[w.verifier.vkey])
        missing = tl.verify_audit_log(
            s, checkpoint=cosigned.note, witness_keys=[other.verifier.vkey]
        )
    assert good.ok and good.checkpoint_ok and "co-signed by 1 witness" in good.checkpoint_detail
    assert not bad.ok and "no valid cosignature from witness w.example/1" in bad.checkpoint_detail
    assert not missing.ok and "w.example/2" in (missing.checkpoint_detail or "")


def test_incremental_verification_starts_from_the_last_verified_checkpoint(
    home: Settings,
) -> None:
    """A successful run remembers the newest signed checkpoint; an incremental run then
    recomputes only later events, yet still catches a rewrite with a recomputed tree (the
    signed roots) and any edit after the marker. An edit below the marker that leaves the
    tree alone is what only a full run finds: both are shown."""
    url = home.db_url
    _grow(url, [f"t{i}" for i in range(6)])
    with session_scope(url) as s:
        signed = tl.sign_log_checkpoint(s, actor="local:auditor")
        first = tl.verify_audit_log(s, incremental=True)
    assert first.ok and first.verified_from == 0  # no marker yet: a full run
    _grow(url, ["later-1", "later-2"])
    with session_scope(url) as s:
        again = tl.verify_audit_log(s, incremental=True)
    assert again.ok and again.verified_from == signed.tree_size
    assert again.tree_size == signed.tree_size + 2
    said = run_cli("audit", "verify", "--incremental")
    flat = " ".join(said.output.split())
    assert said.exit_code == 0 and f"events after {signed.tree_size} recomputed" in flat

    # An edit after the marker is recomputed and found.
    with get_engine(url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(
            text("UPDATE audit_events SET actor = 'local:mallory' WHERE seq = :s"),
            {"s": signed.tree_size + 1},
        )
    with session_scope(url) as s:
        late = tl.verify_audit_log(s, incremental=True)
    assert not late.ok and late.first_bad_seq == signed.tree_size + 1

    # A rewrite below the marker with the tree recomputed: the signed roots catch it.
    rewrite_actor(url, signed.tree_size + 1, "local:alice")  # (restores the later event)
    rewrite_actor(url, 2, "local:mallory")
    with session_scope(url) as s:
        rewritten = tl.verify_audit_log(s, incremental=True)
    assert not rewritten.ok
    assert "root of the checkpoint verified last" in (rewritten.reason or "")


def test_a_row_edit_below_the_marker_needs_a_full_run(home: Settings) -> None:
    url = home.db_url
    _grow(url, ["a", "b", "c"])
    with session_scope(url) as s:
        tl.sign_log_checkpoint(s, actor="local:auditor")
        assert tl.verify_audit_log(s).ok
    with get_engine(url).begin() as conn:
        bypass_append_only(conn)
        conn.execute(text("UPDATE audit_events SET actor = 'local:mallory' WHERE seq = 2"))
    with session_scope(url) as s:
        assert tl.verify_audit_log(s, incremental=True).ok  # the documented limit
        full = tl.verify_audit_log(s)
    assert not full.ok and full.first_bad_seq == 2
