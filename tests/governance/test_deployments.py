"""Validate → promote → rollback with synthetic measurements; history and live-at lookups;
racing promoters on PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from registry.db import session_scope
from registry.errors import Conflict, NotFound
from registry.refs import resolve_deployment, resolve_pair
from registry.services import deployments, drift, validation
from registry.tables import DeploymentEvent, DriftFlag, utcnow
from tests.governance.helpers import (
    ACTOR,
    add_model,
    make_pair,
    put_test_policy,
    store,
    synthetic_result,
)


def _two_pairs(url: str, tmp: Path) -> tuple[str, str]:
    put_test_policy(url)
    t1 = add_model(url, tmp, "acme/target", "target", b"t1")
    d1 = add_model(url, tmp, "acme/draft", "draft", b"d1")
    d2 = add_model(url, tmp, "acme/draft", "draft", b"d2")
    a = make_pair(url, t1, d1)
    b = make_pair(url, t1, d2)
    for digest, seed in ((a, 1), (b, 2)):
        store(url, digest, synthetic_result({"code": 0.8, "prose": 0.7}, seed=seed))
        with session_scope(url) as s:
            res = validation.validate_pair(
                s, ref=digest, policy="test", runner_version="test-1", actor=ACTOR
            )
            assert res.state == "done" and res.validation and res.validation.passed
            assert res.pair_status == "validated"
    with session_scope(url) as s:
        deployments.create_deployment(s, name="prod", policy="test", actor=ACTOR)
    return a, b


def test_promote_rollback_history_and_live_at(db_url: str, tmp_path: Path) -> None:
    a, b = _two_pairs(db_url, tmp_path)
    t0 = utcnow()
    with session_scope(db_url) as s:
        assert deployments.pair_live_at(s, "prod", t0) is None
        r = deployments.promote(s, ref=a, deployment="prod", reason="first", actor=ACTOR)
        assert r.deployment.current_pair_digest == a and r.event.seq == 1
        assert all(g.passed for g in r.gates)
    t1 = utcnow()
    with session_scope(db_url) as s:
        deployments.promote(s, ref=b, deployment="prod", reason="second", actor="bob")
    t2 = utcnow()
    with session_scope(db_url) as s:
        assert resolve_pair(s, a).status == "validated"
        assert resolve_pair(s, b).status == "promoted"
        back = deployments.rollback(s, deployment="prod", reason="bad b", actor=ACTOR)
        assert back.deployment.current_pair_digest == a
        assert resolve_pair(s, a).status == "promoted"
        assert resolve_pair(s, b).status == "validated"
        # nothing before a to roll back to
        with pytest.raises(Conflict, match="no previous pair"):
            deployments.rollback(s, deployment="prod", reason="again", actor=ACTOR)
    with session_scope(db_url) as s:
        dep = deployments.get_deployment(s, name="prod")
        assert [(e.action, e.to_pair_digest, e.actor, e.reason) for e in dep.history or []] == [
            ("promote", a, ACTOR, "first"),
            ("promote", b, "bob", "second"),
            ("rollback", a, ACTOR, "bad b"),
        ]
        assert dep.version == 3
        assert deployments.pair_live_at(s, "prod", t1).pair_digest == a  # type: ignore[union-attr]
        assert deployments.pair_live_at(s, "prod", t2).pair_digest == b  # type: ignore[union-attr]
        assert deployments.pair_live_at(s, "prod", utcnow()).pair_digest == a  # type: ignore[union-attr]
        assert deployments.pair_live_at(s, "prod", t0 - timedelta(days=1)) is None
        assert deployments.pair_live_at(s, "nope", t0) is None


def test_promote_refusals(db_url: str, tmp_path: Path) -> None:
    a, b = _two_pairs(db_url, tmp_path)
    with session_scope(db_url) as s:
        deployments.create_deployment(s, name="other", policy="default", actor=ACTOR)
    with session_scope(db_url) as s, pytest.raises(Conflict, match="validated under test only"):
        deployments.promote(s, ref=a, deployment="other", reason="x", actor=ACTOR)
    with session_scope(db_url) as s, pytest.raises(NotFound):
        deployments.promote(s, ref=a, deployment="missing", reason="x", actor=ACTOR)
    with session_scope(db_url) as s:
        deployments.promote(s, ref=a, deployment="prod", reason="x", actor=ACTOR)
    with session_scope(db_url) as s, pytest.raises(Conflict, match="already live"):
        deployments.promote(s, ref=a, deployment="prod", reason="x", actor=ACTOR)
    with session_scope(db_url) as s, pytest.raises(Conflict, match="not 0"):
        deployments.promote(s, ref=b, deployment="prod", reason="x", expect_version=0, actor=ACTOR)


def test_low_alpha_fails_gates(db_url: str, tmp_path: Path) -> None:
    put_test_policy(db_url)
    t1 = add_model(db_url, tmp_path, "acme/target", "target", b"t1")
    d1 = add_model(db_url, tmp_path, "acme/draft", "draft", b"d1")
    a = make_pair(db_url, t1, d1)
    store(db_url, a, synthetic_result({"code": 0.3, "prose": 0.8}))
    with session_scope(db_url) as s:
        res = validation.validate_pair(
            s, ref=a, policy="test", runner_version="test-1", actor=ACTOR
        )
    assert res.validation is not None and not res.validation.passed
    failed = {g.name for g in res.validation.gates if not g.passed}
    assert failed == {"alpha.code"}
    assert res.pair_status == "registered"


def test_event_seq_is_unique_per_deployment(db_url: str, tmp_path: Path) -> None:
    a, _ = _two_pairs(db_url, tmp_path)
    with session_scope(db_url) as s:
        deployments.promote(s, ref=a, deployment="prod", reason="x", actor=ACTOR)
    with pytest.raises(IntegrityError), session_scope(db_url) as s:
        dep = resolve_deployment(s, "prod")
        s.add(
            DeploymentEvent(
                deployment_id=dep.id,
                seq=1,
                action="promote",
                actor="x",
                reason="dup",
                to_pair_id=resolve_pair(s, a).id,
            )
        )
        s.flush()


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_racing_promoters_postgres(db_url: str, tmp_path: Path) -> None:
    """Promoters racing from the same version: exactly one wins, the history stays linear."""
    a, b = _two_pairs(db_url, tmp_path)
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def go(digest: str) -> None:
        barrier.wait()
        try:
            with session_scope(db_url) as s:
                deployments.promote(
                    s,
                    ref=digest,
                    deployment="prod",
                    reason=f"race {digest[:6]}",
                    expect_version=0,
                    actor=ACTOR,
                )
            outcomes[digest] = "won"
        except Conflict as exc:
            outcomes[digest] = f"lost: {exc}"

    threads = [threading.Thread(target=go, args=(d,)) for d in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [d for d, o in outcomes.items() if o == "won"]
    assert len(winners) == 1, outcomes
    with session_scope(db_url) as s:
        dep = deployments.get_deployment(s, name="prod")
        assert dep.version == 1 and dep.current_pair_digest == winners[0]
        assert [e.to_pair_digest for e in dep.history or []] == winners
        statuses = {d: resolve_pair(s, d).status for d in (a, b)}
    assert sorted(statuses.values()) == ["promoted", "validated"]

    # Without an expected version both promotions go through one after the other, and
    # each event's from_pair is the previous event's to_pair.
    c_threads = [threading.Thread(target=lambda d=d: _promote_free(db_url, d)) for d in (a, b)]
    for t in c_threads:
        t.start()
    for t in c_threads:
        t.join()
    with session_scope(db_url) as s:
        hist = deployments.get_deployment(s, name="prod").history or []
    for prev, nxt in zip(hist, hist[1:], strict=False):
        assert nxt.from_pair_digest == prev.to_pair_digest
        assert nxt.seq == prev.seq + 1


def _promote_free(url: str, digest: str) -> None:
    try:
        with session_scope(url) as s:
            deployments.promote(s, ref=digest, deployment="prod", reason="free", actor=ACTOR)
    except Conflict:
        pass  # already live


def test_changed_file_opens_integrity_flag_that_blocks_promotion(
    sqlite_url: str, tmp_path: Path
) -> None:
    from registry.services import artifacts, drift

    a, _ = _two_pairs(sqlite_url, tmp_path)
    with session_scope(sqlite_url) as s:
        target = resolve_pair(s, a).target
        weights = Path(target.local_path or "") / "model.safetensors"
        ref = f"{target.lineage}@v{target.version}"
    weights.write_bytes(b"tampered")
    with session_scope(sqlite_url) as s:
        report = artifacts.verify_artifact(s, ref=ref, actor=ACTOR)
        assert not report.ok and report.changed == ["model.safetensors"]
        artifacts.verify_artifact(s, ref=ref, actor=ACTOR)  # same finding: no second flag
    with session_scope(sqlite_url) as s:
        flags = drift.list_flags(s, state="open", kind="integrity").items
        assert len(flags) == 1 and flags[0].severity == "high"
        assert "model.safetensors" in flags[0].summary
    with session_scope(sqlite_url) as s, pytest.raises(Conflict, match="integrity"):
        deployments.promote(s, ref=a, deployment="prod", reason="x", actor=ACTOR)
    with session_scope(sqlite_url) as s:
        drift.ack_flag(s, id=flags[0].id, reason="restored from backup", actor=ACTOR)
        deployments.promote(s, ref=a, deployment="prod", reason="x", actor=ACTOR)


def test_a_validated_retrained_drafter_resolves_the_older_drafters_flags(
    db_url: str, tmp_path: Path
) -> None:
    """A drift flag on (target, draft v1) is resolved when (target, draft v2) of the same
    draft lineage passes validation; the re-checked gates run on the validation's own home."""
    put_test_policy(db_url)
    t1 = add_model(db_url, tmp_path, "acme/target", "target", b"t1")
    d1 = add_model(db_url, tmp_path, "acme/draft", "draft", b"d1")
    d2 = add_model(db_url, tmp_path, "acme/draft", "draft", b"d2")
    old, new = make_pair(db_url, t1, d1), make_pair(db_url, t1, d2)
    with session_scope(db_url) as s:
        flag = DriftFlag(kind="drift", pair_id=resolve_pair(s, old).id, effects={},
                         severity="high", summary="α fell on code")  # fmt: skip
        flag_id = drift.open_flag(s, flag, actor="worker:w1", payload={"pair": old}).id
    store(db_url, new, synthetic_result({"code": 0.8, "prose": 0.7}, seed=3))
    with session_scope(db_url) as s:
        res = validation.validate_pair(
            s, ref=new, policy="test", runner_version="test-1", actor=ACTOR,
            home_dir=str(tmp_path / "home"),
        )  # fmt: skip
        assert res.validation is not None and res.validation.passed
    with session_scope(db_url) as s:
        closed = s.get(DriftFlag, flag_id)
        assert closed is not None and closed.state == "resolved"
        assert closed.reason is not None
        assert closed.reason.startswith(f"retrained drafter validated: pair {new[:12]}")
