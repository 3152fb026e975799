"""Storing and reading policies: a name's newest stored version is the one in force.

The shipped ``default`` policy is stored on first use, so a fresh registry can validate
without any setup and the validation still points at a stored, digested policy row.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.errors import NotFound
from registry.governance.policy import (
    DEFAULT_POLICY_NAME,
    default_policy_text,
    parse_policy,
    policy_digest,
)
from registry.params import Cursor, Limit
from registry.records.core import Page, from_row
from registry.records.governance import PolicyPutResult, PolicyRecord
from registry.services.base import page_query
from registry.tables import Policy
from registry.trust.audit import append_event, lock_writes

DEFAULT_POLICY = DEFAULT_POLICY_NAME


def to_record(row: Policy) -> PolicyRecord:
    return from_row(PolicyRecord, row)


def _store(session: Session, text: str, name: str | None, actor: str) -> tuple[Policy, bool]:
    parsed = parse_policy(text, name=name)
    digest = policy_digest(parsed)
    lock_writes(session)
    existing = session.scalar(
        select(Policy).where(Policy.name == parsed["name"], Policy.digest == digest)
    )
    latest = session.scalar(select(func.max(Policy.version)).where(Policy.name == parsed["name"]))
    if existing is not None and existing.version == latest:
        return existing, False
    row = Policy(
        name=parsed["name"],
        version=(latest or 0) + 1,
        digest=digest,
        toml_text=text,
        parsed=parsed,
        created_by=actor,
    )
    session.add(row)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="policy.stored",
        entity_type="policy",
        entity_id=row.name,
        payload={"name": row.name, "version": row.version, "digest": digest},
    )
    return row, True


def put_policy(
    session: Session,
    *,
    text: Annotated[str, Field(min_length=1, max_length=100_000, description="Policy TOML.")],
    name: Annotated[str | None, Field(description="Store under this name instead.")] = None,
    actor: str,
) -> PolicyPutResult:
    """Store a policy TOML under its ``name`` (or the given one); unchanged text is a no-op."""
    row, created = _store(session, text, name, actor)
    return PolicyPutResult(policy=to_record(row), created=created)


def policy_in_force(session: Session, name: str) -> Policy | None:
    """The newest version stored under ``name`` (None when there is none yet)."""
    return session.scalar(
        select(Policy).where(Policy.name == name).order_by(Policy.version.desc()).limit(1)
    )


def load_policy(session: Session, name: str, *, actor: str = "system") -> Policy:
    """The policy in force under ``name``; the shipped default is stored on first use."""
    row = policy_in_force(session, name)
    if row is None and name == DEFAULT_POLICY:
        row, _ = _store(session, default_policy_text(), DEFAULT_POLICY, actor)
    if row is None:
        raise NotFound(f"no policy named {name}", field="policy")
    return row


def get_policy(
    session: Session,
    *,
    name: str,
    version: Annotated[int | None, Field(ge=1, le=2**31)] = None,
    actor: str = "system",
) -> PolicyRecord:
    if version is None:
        return to_record(load_policy(session, name, actor=actor))
    row = session.scalar(select(Policy).where(Policy.name == name, Policy.version == version))
    if row is None:
        raise NotFound(f"no policy {name} version {version}", field="version")
    return to_record(row)


def list_policies(
    session: Session, *, name: str | None = None, cursor: Cursor = None, limit: Limit = 100
) -> Page[PolicyRecord]:
    stmt = select(Policy)
    if name:
        stmt = stmt.where(Policy.name == name)
    rows, next_cursor = page_query(session, stmt, Policy.id, cursor, limit)
    return Page[PolicyRecord](items=[to_record(r) for r in rows], next_cursor=next_cursor)
