"""A registry with two pairs and a deployment whose live pair changes at known instants.

Promotion gates need a measured, validated pair, which is the governance area's business
and needs the runner; these tests are about what happens after a pair is live, so they move
the deployment with governance's own move primitive (the same CAS, deployment event and
audit event a gated promotion writes) and, where a validation matters, record one directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from registry.db import session_scope
from registry.governance import lifecycle
from registry.refs import resolve_deployment
from registry.services import artifacts as art_svc
from registry.services import pairs as pair_svc
from registry.tables import DeploymentEvent, Pair
from tests.fixtures import write_fake_model

ACTOR = "token:test"


@dataclass
class Served:
    url: str
    deployment: str
    pair_a: str  # live from t_a
    pair_b: str  # live from t_b (replaces a)
    pair_c: str  # registered, never live
    t_a: datetime
    t_b: datetime
    target_dir: Path
    draft_dir: Path


def promote_at(url: str, deployment: str, pair_digest: str, at: datetime) -> None:
    """Make ``pair_digest`` live on ``deployment`` with governance's move, dated ``at``."""
    from registry.services import deployments as dep_svc

    with session_scope(url) as session:
        dep = None
        try:
            dep = resolve_deployment(session, deployment)
        except Exception:  # noqa: BLE001 - not created yet
            dep_svc.create_deployment(session, name=deployment, actor=ACTOR)
            dep = resolve_deployment(session, deployment)
        pair = session.query(Pair).filter(Pair.pair_digest == pair_digest).one()
        if lifecycle.allowed(pair.status, "validated"):  # stands in for a passing validation
            lifecycle.apply(session, pair, "validated", actor=ACTOR, reason="test validation")
        ev = dep_svc._move(
            session,
            dep,
            action="promote",
            to_pair=pair,
            reason="test promotion",
            validation_id=None,
            expect_version=None,
            actor=ACTOR,
        )
        session.execute(update(DeploymentEvent).where(DeploymentEvent.id == ev.id).values(at=at))


def build_registry(url: str, tmp: Path) -> Served:
    target = write_fake_model(tmp / "target", weights=b"target-weights")
    draft = write_fake_model(tmp / "draft", weights=b"draft-weights", hidden_size=32)
    with session_scope(url) as s:
        t = art_svc.add_artifact(
            s, source=str(target), name="acme/target", role="target", actor=ACTOR
        ).artifact
        d = art_svc.add_artifact(
            s, source=str(draft), name="acme/draft", role="draft", actor=ACTOR
        ).artifact
        a = pair_svc.register_pair(
            s, target=t.ref, draft=d.ref, method="draft_model", k=4, actor=ACTOR
        ).pair
        b = pair_svc.register_pair(
            s, target=t.ref, draft=d.ref, method="draft_model", k=3, actor=ACTOR
        ).pair
        c = pair_svc.register_pair(s, target=t.ref, method="prompt_lookup", k=4, actor=ACTOR).pair
    now = datetime.now().astimezone()
    t_a = now - timedelta(hours=2)
    t_b = now - timedelta(hours=1)
    promote_at(url, "chat-prod", a.pair_digest, t_a)
    promote_at(url, "chat-prod", b.pair_digest, t_b)
    return Served(
        url, "chat-prod", a.pair_digest, b.pair_digest, c.pair_digest, t_a, t_b, target, draft
    )


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Served:
    return build_registry(db_url, tmp_path)


@pytest.fixture
def served_sqlite(sqlite_url: str, tmp_path: Path) -> Served:
    return build_registry(sqlite_url, tmp_path)
