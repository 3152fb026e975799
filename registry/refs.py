"""Parsing and resolving references: ``42``, a 12+ hex digest prefix, ``LINEAGE@vN|latest``."""

from __future__ import annotations

import re

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.errors import InvalidInput, NotFound
from registry.tables import Artifact, Deployment, Pair

_ID = re.compile(r"^\d{1,11}$")
_HEX = re.compile(r"^[0-9a-f]{12,64}$")
_LINEAGE_REF = re.compile(r"^(?P<name>[^@\s]+)@(?:v(?P<version>\d+)|(?P<latest>latest))$")

REF_HELP = "an id, a digest prefix of at least 12 hex characters, LINEAGE@vN or LINEAGE@latest"


def _by_prefix(session: Session, column, prefix: str, what: str, field: str):  # type: ignore[no-untyped-def]
    rows = session.execute(select(column.class_).where(column.startswith(prefix)).limit(2))
    found = list(rows.scalars().unique())
    if not found:
        raise NotFound(f"no {what} with digest prefix {prefix}", field=field)
    if len(found) > 1:
        raise InvalidInput(
            f"digest prefix {prefix} is ambiguous: give more characters", field=field
        )
    return found[0]


def resolve_artifact(session: Session, ref: str, *, field: str = "ref") -> Artifact:
    ref = ref.strip()
    if _ID.match(ref):
        art = session.get(Artifact, int(ref))
        if art is None:
            raise NotFound(f"no artifact with id {ref}", field=field)
        return art
    if _HEX.match(ref.lower()):
        return _by_prefix(session, Artifact.manifest_digest, ref.lower(), "artifact", field)
    match = _LINEAGE_REF.match(ref)
    if match:
        name = match["name"]
        if match["latest"]:
            version = session.scalar(
                select(func.max(Artifact.version)).where(Artifact.lineage == name)
            )
            if version is None:
                raise NotFound(f"no artifact in lineage {name}", field=field)
        else:
            version = int(match["version"])
        art = session.scalar(
            select(Artifact).where(Artifact.lineage == name, Artifact.version == version)
        )
        if art is None:
            raise NotFound(f"no artifact {name}@v{version}", field=field)
        return art
    raise InvalidInput(f"{field} {ref!r} is not a valid reference: use {REF_HELP}", field=field)


def resolve_pair(session: Session, ref: str, *, field: str = "pair") -> Pair:
    ref = ref.strip()
    if _ID.match(ref):
        pair = session.get(Pair, int(ref))
        if pair is None:
            raise NotFound(f"no pair with id {ref}", field=field)
        return pair
    if _HEX.match(ref.lower()):
        return _by_prefix(session, Pair.pair_digest, ref.lower(), "pair", field)
    raise InvalidInput(
        f"{field} {ref!r} is not a valid pair reference: use an id or a digest prefix "
        "of at least 12 hex characters",
        field=field,
    )


def deployment_named(session: Session, name: str, *, lock: bool = False) -> Deployment | None:
    """The deployment called ``name``, or None (``lock``: for the move that changes its live
    pair). The lock is FOR NO KEY UPDATE on PostgreSQL: the move changes no key, and a plain
    FOR UPDATE would wait on the KEY SHARE locks that inserting request tags (foreign keys
    to the deployment) take, while those inserts wait on the registry write lock the move
    holds: a deadlock under concurrent ingest and promotion."""
    stmt = select(Deployment).where(Deployment.name == name)
    if lock:
        stmt = stmt.with_for_update(key_share=True)
    return session.scalar(stmt)


def resolve_deployment(
    session: Session, name: str, *, field: str = "deployment", lock: bool = False
) -> Deployment:
    """The deployment called ``name``; NotFound naming ``field`` when there is none."""
    dep = deployment_named(session, name, lock=lock)
    if dep is None:
        raise NotFound(f"no deployment named {name}", field=field)
    return dep
