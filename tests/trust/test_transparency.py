"""The audit log as a transparency log, on SQLite and PostgreSQL: proofs from the stored
tree, C2SP checkpoints, the backfill migration, tampering, and the witness."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from registry import db
from registry.canonical import canonical_json
from registry.db import get_engine, session_scope
from registry.errors import Conflict, InvalidInput, NotFound
from registry.services import transparency as tl
from registry.settings import Settings
from registry.trust import audit, audit_tree, merkle, signed_note
from registry.trust.witness import ForkDetected, Witness
from tests.fixtures import bypass_append_only


def append(url: str, n: int, start: int = 0) -> None:
    with session_scope(url) as s:
        for i in range(start, start + n):
            audit.append_event(
                s,
                actor="test:writer",
                action="test.event",
                entity_type="test",
                entity_id=i,
                payload={"i": i, "note": f"event number {i}", "score": 0.5},
            )


def all_leaves(url: str) -> list[bytes]:
    with session_scope(url) as s:
        audit.integrate(s)  # integrate before read
        return list(audit_tree.leaves_from_events(s))


def test_proofs_checkpoints_and_tree_verification(home: Settings) -> None:
    url = home.db_url
    append(url, 40)  # plus the admin-token event from `initialise`
    leaves = all_leaves(url)
    size = len(leaves)
    assert size == 41
    with session_scope(url) as s:
        audit.integrate(s)  # integrate before read
        assert audit_tree.tree_size(s) == size
        for old in (0, 1, 2, 7, 8, 16, 33, size):
            for new in (old, min(size, old + 1), size):
                p = tl.prove_consistency(s, old_size=old, new_size=new)
                assert p.old_root == merkle.root_from_leaves(leaves[:old]).hex()
                assert p.new_root == merkle.root_from_leaves(leaves[:new]).hex()
                assert merkle.verify_consistency(
                    old,
                    new,
                    bytes.fromhex(p.old_root),
                    bytes.fromhex(p.new_root),
                    [bytes.fromhex(h) for h in p.path],
                )
        for seq in (1, 2, 20, 41):
            for at in (seq, 32, size):
                if at < seq:
                    continue
                p = tl.prove_inclusion(s, seq=seq, tree_size=at)
                assert p.leaf_data.encode() == canonical_json(p.event)
                assert p.event["seq"] == seq and p.tree_size == at
                assert p.root_hash == merkle.root_from_leaves(leaves[:at]).hex()
                assert merkle.verify_inclusion(
                    merkle.leaf_hash(p.leaf_data.encode()),
                    p.leaf_index,
                    at,
                    [bytes.fromhex(h) for h in p.path],
                    bytes.fromhex(p.root_hash),
                )
        with pytest.raises(NotFound):
            tl.prove_inclusion(s, seq=30, tree_size=20)
        with pytest.raises(InvalidInput) as bad:
            tl.prove_consistency(s, old_size=5, new_size=size + 1)
        assert bad.value.field == "new_size"
        with pytest.raises(InvalidInput):
            tl.prove_consistency(s, old_size=10, new_size=5)

        first = tl.sign_log_checkpoint(s, actor="test:auditor")
    assert first.created and first.tree_size == size
    log = signed_note.Verifier.parse(first.verifier_key)
    cp, _ = signed_note.open_checkpoint(first.note, log)
    assert cp.root == merkle.root_from_leaves(leaves) and cp.origin == log.name == first.origin
    assert first.origin.startswith("pairreg/audit/")
    with session_scope(url) as s:
        again = tl.sign_log_checkpoint(s, actor="test:auditor")
        assert not again.created and again.note == first.note
        assert tl.get_log_checkpoint(s).note == first.note
        assert tl.verify_audit_log(s, checkpoint=first.note).ok
    append(url, 5, start=40)
    with session_scope(url) as s:
        second = tl.sign_log_checkpoint(s, actor="test:auditor")
        verdict = tl.verify_audit_log(s, checkpoint=first.note)
    assert second.tree_size == size + 5
    assert verdict.ok and verdict.checkpoint_ok and verdict.tree_size == size + 5


REWRITTEN = {"i": 1, "note": "rewritten", "score": 0.5}


def _superuser(conn) -> None:  # type: ignore[no-untyped-def]
    """Bypass the append-only triggers as a database superuser (or the file's holder) could."""
    bypass_append_only(conn)


def _rewrite_event_3(url: str, *, relink: bool) -> None:
    """Change an old event; with ``relink``, also recompute the stored tree, so that every
    check computed from the database alone holds again."""
    with get_engine(url).begin() as conn:
        _superuser(conn)
        conn.execute(
            text("UPDATE audit_events SET payload = :p WHERE seq = 3"),
            {"p": json.dumps(REWRITTEN)},
        )
        if not relink:
            return
        audit_tree.rebuild(conn)


def _forget_checkpoints(url: str) -> None:
    with get_engine(url).begin() as conn:
        _superuser(conn)
        conn.execute(text("DELETE FROM log_checkpoints"))


def test_rewritten_history_is_caught_by_log_witness_and_checkpoint(
    home: Settings, tmp_path: Path
) -> None:
    url = home.db_url
    append(url, 12)
    with session_scope(url) as s:
        c1 = tl.sign_log_checkpoint(s, actor="test:auditor")
    witness = Witness(
        name="witness.example/w1",
        key_path=tmp_path / "w.key",
        state_path=tmp_path / "w.state",
        log_key=c1.verifier_key,
    )

    def prove(old: int, new: int) -> list[bytes]:
        with session_scope(url) as s:
            p = tl.prove_consistency(s, old_size=old, new_size=new)
        return [bytes.fromhex(h) for h in p.path]

    first = witness.cosign(c1.note, prove)
    assert first.new_size == 13 and "first checkpoint" in first.detail
    opened = signed_note.parse_note(first.note)
    assert signed_note.verify(opened, [witness.verifier]) == {"witness.example/w1": first.timestamp}

    # Editing one row: the tree (the log's commitment) is unchanged, so checkpoints stay
    # consistent, but the event no longer proves into them and the recomputation finds it.
    _rewrite_event_3(url, relink=False)
    with session_scope(url) as s:
        report = tl.verify_audit_log(s)
        assert not report.ok and report.first_bad_seq == 3
        p = tl.prove_inclusion(s, seq=3, tree_size=13)
        assert p.event["payload"] == REWRITTEN
        assert not merkle.verify_inclusion(
            merkle.leaf_hash(p.leaf_data.encode()),
            2,
            13,
            [bytes.fromhex(h) for h in p.path],
            bytes.fromhex(c1.root_hash),
        )

    # Rewriting history (tree recomputed from the rewritten events): every check inside the database
    # holds again, but the log refuses to sign a tree that does not extend its checkpoint...
    _rewrite_event_3(url, relink=True)
    append(url, 3, start=200)
    with session_scope(url) as s:
        report = tl.verify_audit_log(s)
        assert report.reason is None and audit_tree.verify_tree(s).ok
        # ...except the comparison with the checkpoint the log signed.
        assert not report.ok and report.signed_ok is False
        assert "events 1..13 was changed" in (report.signed_detail or "")
        with pytest.raises(Conflict, match="does not extend its checkpoint at size 13"):
            tl.sign_log_checkpoint(s, actor="attacker")
    # Deleting the checkpoint rows is not enough: the copy kept outside the database still
    # refuses...
    _forget_checkpoints(url)
    with session_scope(url) as s:
        with pytest.raises(Conflict, match="size 13 \\(kept outside the database\\)"):
            tl.sign_log_checkpoint(s, actor="attacker")
    # ...and when that copy is deleted too (someone who can reach the key's directory), the
    # checkpoint held elsewhere and the witness still catch it.
    for kept in (home.signing_key_path.parent / "log-checkpoints").iterdir():
        kept.unlink()
    with session_scope(url) as s:
        c2 = tl.sign_log_checkpoint(s, actor="attacker")
        verdict = tl.verify_audit_log(s, checkpoint=c1.note)
    assert not verdict.ok and verdict.checkpoint_ok is False
    assert "does not extend the checkpoint at size 13" in (verdict.checkpoint_detail or "")
    state_before = (tmp_path / "w.state").read_text()
    with pytest.raises(ForkDetected, match="FORK DETECTED.*consistency proof fails") as fork:
        witness.cosign(c2.note, prove)
    assert (tmp_path / "w.state").read_text() == state_before  # state not advanced
    evidence = Path(fork.value.details["evidence"]).read_text()
    assert c1.note.split("\n\n")[0] in evidence and c2.note.split("\n\n")[0] in evidence


def test_witness_detects_two_checkpoints_of_one_size(home: Settings, tmp_path: Path) -> None:
    url = home.db_url
    append(url, 6)
    with session_scope(url) as s:
        real = tl.sign_log_checkpoint(s, actor="test:auditor")
    log_key = audit.load_private_key(home.signing_key_path)
    origin = real.origin
    # The same key signs a different history of the same size (a split view).
    other = signed_note.Checkpoint(origin, real.tree_size, b"\x42" * 32).text
    split_view = signed_note.Note(other, [signed_note.sign(other, origin, log_key)]).render()
    witness = Witness(
        name="witness.example/w2",
        key_path=tmp_path / "w.key",
        state_path=tmp_path / "w.state",
        log_key=real.verifier_key,
    )
    calls: list[tuple[int, int]] = []

    def prove(old: int, new: int) -> list[bytes]:
        calls.append((old, new))
        return []

    witness.cosign(real.note, prove)
    again = witness.cosign(real.note, prove)  # the same checkpoint again: fine, no proof needed
    assert again.new_size == real.tree_size and calls == []
    assert again.note.count("\u2014 witness.example/w2 ") == 1
    with pytest.raises(ForkDetected, match="two checkpoints of size 7 with different roots"):
        witness.cosign(split_view, prove)
    # A checkpoint not signed by the log is refused as bad input, not as a fork.
    stranger = signed_note.Note(other, [signed_note.sign(other, origin, tl_key())]).render()
    with pytest.raises(InvalidInput, match="checkpoint refused"):
        witness.cosign(stranger, prove)
    # Going back to an older, smaller checkpoint is refused.
    small = signed_note.Checkpoint(origin, 3, b"\x01" * 32).text
    older = signed_note.Note(small, [signed_note.sign(small, origin, log_key)]).render()
    with pytest.raises(Conflict, match="older than the 7 already co-signed"):
        witness.cosign(older, prove)


def tl_key():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


def test_backfill_builds_the_tree_for_existing_events(tmp_path: Path) -> None:
    """Events written before the transparency migration get their tree on upgrade."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    db.upgrade(url, "0004")
    prev = "0" * 64
    bodies = []
    with get_engine(url).begin() as conn:
        for seq in range(1, 38):
            body = {
                "seq": seq,
                "occurred_at": "2026-01-02T03:04:05.000006Z",
                "actor": "old:writer",
                "action": "old.event",
                "entity_type": "test",
                "entity_id": str(seq),
                "payload": {"seq": seq},
            }
            h = hashlib.sha256(bytes.fromhex(prev) + canonical_json(body)).hexdigest()
            conn.execute(
                text(
                    "INSERT INTO audit_events (seq, occurred_at, actor, action, entity_type, "
                    "entity_id, payload, prev_hash, chain_hash) VALUES (:seq, :at, :actor, "
                    ":action, :et, :eid, :payload, :prev, :h)"
                ),
                {
                    "seq": seq,
                    "at": "2026-01-02 03:04:05.000006",
                    "actor": body["actor"],
                    "action": body["action"],
                    "et": body["entity_type"],
                    "eid": body["entity_id"],
                    "payload": canonical_json(body["payload"]).decode(),
                    "prev": prev,
                    "h": h,
                },
            )
            prev = h
            bodies.append(body)
    db.upgrade(url)  # through revision 0010, which checks the chain before retiring it
    with session_scope(url) as s:
        audit.integrate(s)  # integrate before read
        report = audit_tree.verify_tree(s)
        assert report.ok and report.size == 37
        expected = merkle.root_from_leaves([merkle.leaf_hash(canonical_json(b)) for b in bodies])
        assert report.root == expected
        audit.append_event(
            s, actor="new", action="new.event", entity_type="t", entity_id=1, payload={}
        )
    with session_scope(url) as s:
        audit.integrate(s)  # integrate before read
        assert audit_tree.verify_tree(s).size == 38
    db.dispose_engines()
