"""Eight writers at once on PostgreSQL: a gapless, unique sequence, an intact chain, and
identical content registered concurrently stored once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select

from registry.db import session_scope
from registry.services.artifacts import add_artifact
from registry.services.pairs import register_pair
from registry.tables import Artifact, AuditEvent, Pair
from registry.trust import audit, audit_tree
from tests.fixtures import write_fake_model

WRITERS = 8


@pytest.mark.postgres
def test_concurrent_writers_keep_the_chain_gapless(pg_url: str, tmp_path: Path) -> None:
    shared_target = write_fake_model(tmp_path / "target")
    drafts = [
        write_fake_model(tmp_path / f"d{i}", hidden_size=32, weights=f"d{i}".encode())
        for i in range(WRITERS)
    ]
    shared_draft = write_fake_model(tmp_path / "shared-d", hidden_size=32, weights=b"shared")
    barrier = threading.Barrier(WRITERS)
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            barrier.wait()
            out: dict = {}
            # Everyone races to register the same target and the same shared drafter...
            with session_scope(pg_url) as s:
                out["target"] = add_artifact(
                    s, source=str(shared_target), name="acme/t", role="target", actor=f"w{i}"
                )
            with session_scope(pg_url) as s:
                out["shared"] = add_artifact(
                    s, source=str(shared_draft), name="acme/shared", role="draft", actor=f"w{i}"
                )
            # ...and also registers content of its own.
            with session_scope(pg_url) as s:
                out["own"] = add_artifact(
                    s, source=str(drafts[i]), name=f"acme/d{i}", role="draft", actor=f"w{i}"
                )
            barrier.wait()
            with session_scope(pg_url) as s:
                out["shared_pair"] = register_pair(
                    s,
                    target="acme/t@v1",
                    draft="acme/shared@v1",
                    method="draft_model",
                    k=4,
                    actor=f"w{i}",
                )
            with session_scope(pg_url) as s:
                out["own_pair"] = register_pair(
                    s,
                    target="acme/t@v1",
                    draft=f"acme/d{i}@v1",
                    method="draft_model",
                    k=4,
                    actor=f"w{i}",
                )
            results[i] = out
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(results) == WRITERS

    for key in ("target", "shared", "shared_pair"):
        created = [r[key].created for r in results.values()]
        assert created.count(True) == 1, (key, created)
    assert len({r["target"].artifact.id for r in results.values()}) == 1
    assert len({r["shared_pair"].pair.id for r in results.values()}) == 1
    assert all(r["own"].created and r["own_pair"].created for r in results.values())

    with session_scope(pg_url) as s:
        seqs = list(s.scalars(select(AuditEvent.seq).order_by(AuditEvent.seq)))
        n_artifacts = s.scalar(select(func.count()).select_from(Artifact))
        n_pairs = s.scalar(select(func.count()).select_from(Pair))
        audit.integrate(s)  # integrate before read
        report = audit_tree.verify_tree(s)
    # 1 target + 1 shared drafter + 8 own drafters; 1 shared pair + 8 own pairs.
    assert n_artifacts == 2 + WRITERS and n_pairs == 1 + WRITERS
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(seqs) == n_artifacts + n_pairs
    assert report.ok and report.size == len(seqs) == seqs[-1]
