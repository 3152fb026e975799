"""Which pair a deployment served at an instant: the one rule, for one tag or a batch.

A deployment's moves are ``deployment_events`` rows in ``seq`` order, each stamped with the
writer's clock. A move takes effect at its time; a move stamped earlier than the one before
it (writers' clocks disagree) takes effect at its predecessor's time, so the history stays
ordered by ``seq`` and every instant has one answer. The move live at ``t`` is then the last
one before the first move stamped after ``t``.

:func:`load_timelines` reads whole histories once (ingest fills in the pair of thousands of
tags per batch with a binary search each); :func:`live_event` asks the database for the one
move live at an instant (an audit of one request, ``pair_live_at``) without reading a
history that grows with every promotion. ``tests/core/test_timeline.py`` holds the two to
the same answers, skewed clocks included.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.orm import Session

from registry.tables import DeploymentEvent


@dataclass
class Timeline:
    """A deployment's moves, oldest first: which pair was live from which instant."""

    times: list[datetime]
    pair_ids: list[int | None]
    event_ids: list[int]

    def live_at(self, at: datetime) -> tuple[int | None, int | None]:
        """(pair id, deployment event id) live at ``at``; (None, None) before the first move."""
        i = bisect.bisect_right(self.times, at) - 1
        if i < 0:
            return None, None
        return self.pair_ids[i], self.event_ids[i]


def load_timelines(session: Session, deployment_ids: Iterable[int]) -> dict[int, Timeline]:
    ids = sorted(set(deployment_ids))
    out = {d: Timeline([], [], []) for d in ids}
    if not ids:
        return out
    rows = session.execute(
        select(
            DeploymentEvent.deployment_id,
            DeploymentEvent.at,
            DeploymentEvent.to_pair_id,
            DeploymentEvent.id,
        )
        .where(DeploymentEvent.deployment_id.in_(ids))
        .order_by(DeploymentEvent.deployment_id, DeploymentEvent.seq)
    )
    for dep_id, at, to_pair, event_id in rows:
        tl = out[dep_id]
        if tl.times and at < tl.times[-1]:
            at = tl.times[-1]  # clock skew between writers: keep the history ordered by seq
        tl.times.append(at)
        tl.pair_ids.append(to_pair)
        tl.event_ids.append(event_id)
    return out


_FIRST_LATER = (
    select(func.min(DeploymentEvent.seq))
    .where(
        DeploymentEvent.deployment_id == bindparam("deployment_id"),
        DeploymentEvent.at > bindparam("at"),
    )
    .scalar_subquery()
)
_LIVE_EVENT = (
    select(DeploymentEvent)
    .where(
        DeploymentEvent.deployment_id == bindparam("deployment_id"),
        or_(_FIRST_LATER.is_(None), DeploymentEvent.seq < _FIRST_LATER),
    )
    .order_by(DeploymentEvent.seq.desc())
    .limit(1)
)


def live_event(session: Session, deployment_id: int, at: datetime) -> DeploymentEvent | None:
    """The move of ``deployment_id`` live at ``at`` (None before its first move), in one
    query on the ``(deployment_id, seq)`` and ``(deployment_id, at)`` indexes."""
    return session.scalar(_LIVE_EVENT, {"deployment_id": deployment_id, "at": at})
