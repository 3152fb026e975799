"""Watching Hub branches: a lineage registered from ``hf://org/repo@main`` follows ``main``.

When the branch points at a new commit, that commit is registered as the lineage's next
version through the ordinary ``add_artifact`` path, so it is a target change like any other
(candidate pairs, re-measurement, drift test).
"""

from __future__ import annotations

import re

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.artifacts import hub
from registry.records.core import Provenance
from registry.records.governance import WatchResult
from registry.services.artifacts import add_artifact
from registry.tables import Artifact, Lineage

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def watched_lineages(session: Session, lineage: str | None = None) -> list[Artifact]:
    """Each lineage's newest version when it came from a Hub branch or tag (not a commit)."""
    newest = (
        select(Artifact.lineage, func.max(Artifact.version).label("v"))
        .group_by(Artifact.lineage)
        .subquery()
    )
    stmt = (
        select(Artifact)
        .join(newest, (Artifact.lineage == newest.c.lineage) & (Artifact.version == newest.c.v))
        .where(Artifact.source_kind == "hf")
    )
    if lineage:
        stmt = stmt.where(Artifact.lineage == lineage)
    rows = session.scalars(stmt.order_by(Artifact.lineage)).all()
    return [a for a in rows if a.hub_revision and not _COMMIT.match(a.hub_revision.lower())]


def watch(
    session: Session,
    *,
    lineage: str | None = None,
    actor: str,
    hub_access: hub.HubAccess | None = None,
) -> list[WatchResult]:
    """Poll every watched branch once; register the new commit where a branch moved
    (``hub_access``, filled by the edge: the configured token per repository)."""
    access = hub_access or hub.HubAccess()
    results: list[WatchResult] = []
    for art in watched_lineages(session, lineage):
        source = f"hf://{art.hub_repo}@{art.hub_revision}"
        try:
            head = hub.branch_head(source, access=access)
        except hub.HubError as exc:
            results.append(
                WatchResult(
                    lineage=art.lineage,
                    source=source,
                    previous_commit=art.hub_commit,
                    registered=False,
                    error=str(exc),
                )
            )
            continue
        if head == art.hub_commit:
            results.append(
                WatchResult(
                    lineage=art.lineage,
                    source=source,
                    previous_commit=art.hub_commit,
                    current_commit=head,
                    registered=False,
                )
            )
            continue
        role = session.get(Lineage, art.lineage)
        # Registering the branch (not the commit) keeps the new version following it.
        added = add_artifact(
            session,
            source=source,
            name=art.lineage,
            role=role.role if role else art.role,  # type: ignore[arg-type]
            provenance=Provenance.model_validate(art.provenance),
            actor=actor,
            hub_access=access,
        )
        head = added.artifact.hub_commit or head
        results.append(
            WatchResult(
                lineage=art.lineage,
                source=source,
                previous_commit=art.hub_commit,
                current_commit=head,
                registered=added.created,
                artifact_id=added.artifact.id,
            )
        )
    return results
