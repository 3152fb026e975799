"""API tokens: creation (secret shown once), listing, revocation and authentication."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Annotated

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthorized
from registry.governance.roles import ROLES, Duty, TokenRole, capabilities, holds
from registry.params import Cursor, Limit
from registry.records.core import Identity, Page, TokenCreated, TokenRecord, from_row
from registry.services.base import page_query
from registry.tables import ApiToken, utcnow
from registry.trust.audit import append_event, lock_writes

TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
_NAME = re.compile(TOKEN_NAME_PATTERN)
TOKEN_PREFIX = "prt_"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def to_record(tok: ApiToken) -> TokenRecord:
    return from_row(TokenRecord, tok)


def create_token(
    session: Session,
    *,
    name: Annotated[
        str,
        Field(
            pattern=TOKEN_NAME_PATTERN,
            description="Unique; letters, digits, '.', '_' or '-'; starts with a letter or digit.",
        ),
    ],
    role: TokenRole,
    actor: str,
) -> TokenCreated:
    """Mint 32 random bytes; only the SHA-256 of the secret is stored."""
    if not _NAME.match(name or ""):
        raise InvalidInput(
            "name must be 1-100 letters, digits, '.', '_' or '-' and start with a letter or digit",
            field="name",
        )
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}", field="role")
    lock_writes(session)
    if session.scalar(select(ApiToken).where(ApiToken.name == name)) is not None:
        raise Conflict(f"a token named {name} already exists", field="name")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    tok = ApiToken(name=name, role=role, token_hash=hash_secret(secret), created_by=actor)
    session.add(tok)
    session.flush()
    append_event(
        session,
        actor=actor,
        action="token.created",
        entity_type="token",
        entity_id=tok.id,
        payload={"name": name, "role": role},
    )
    return TokenCreated(token=to_record(tok), secret=secret)


def list_tokens(
    session: Session, *, cursor: Cursor = None, limit: Limit = 100
) -> Page[TokenRecord]:
    rows, next_cursor = page_query(session, select(ApiToken), ApiToken.id, cursor, limit)
    return Page[TokenRecord](items=[to_record(t) for t in rows], next_cursor=next_cursor)


def whoami(session: Session, *, actor: str, mlflow_ui: str | None = None) -> Identity:
    """The caller's token, role and capabilities.

    Clients such as the dashboard read this to show only the actions the role may take; the
    server still checks every call. Over HTTP the actor is ``token:<name>``; embedded, the
    local user acts with the database's full authority (admin).
    """
    if actor.startswith("token:"):
        name = actor.removeprefix("token:")
        tok = session.scalar(select(ApiToken).where(ApiToken.name == name))
        if tok is None:
            raise NotFound(f"no token named {name}", field="actor")
        token: str | None = name
        role = tok.role
    else:
        token, role = None, "admin"
    return Identity(
        actor=actor,
        token=token,
        role=role,
        capabilities=capabilities(role),
        mlflow_ui=mlflow_ui,
    )


def revoke_token(session: Session, *, name: str, actor: str) -> TokenRecord:
    lock_writes(session)
    tok = session.scalar(select(ApiToken).where(ApiToken.name == name))
    if tok is None:
        raise NotFound(f"no token named {name}", field="name")
    if tok.revoked_at is None:
        tok.revoked_at = utcnow()
        append_event(
            session,
            actor=actor,
            action="token.revoked",
            entity_type="token",
            entity_id=tok.id,
            payload={"name": name},
        )
    return to_record(tok)


def authenticate(session: Session, secret: str) -> ApiToken:
    """Find the live token for a presented secret, comparing hashes in constant time."""
    presented = hash_secret(secret)
    tok = session.scalar(select(ApiToken).where(ApiToken.token_hash == presented))
    if tok is None or not hmac.compare_digest(tok.token_hash, presented):
        raise Unauthorized("invalid bearer token")
    if tok.revoked_at is not None:
        raise Unauthorized("bearer token has been revoked")
    now = utcnow()
    # Throttled so that read traffic does not turn every request into a write.
    if tok.last_used_at is None or (now - tok.last_used_at).total_seconds() > 60:
        tok.last_used_at = now
    return tok


TOKEN_ACTOR = "token:"


def actor_role(session: Session, actor: str) -> str | None:
    """The role behind ``actor``: the token's role for ``token:<name>`` (every caller over
    HTTP acts as its token), ``""`` for a token that is gone or revoked (no duty at all), and
    None for an actor without a token: the embedded registry's own user (or its in-process
    worker), who owns the database and so holds every duty on it."""
    if not actor.startswith(TOKEN_ACTOR):
        return None
    tok = session.scalar(select(ApiToken).where(ApiToken.name == actor[len(TOKEN_ACTOR) :]))
    if tok is None or tok.revoked_at is not None:
        return ""
    return tok.role


def require_duty(session: Session, actor: str, duty: Duty, *, rule: str, field: str) -> None:
    """Refuse (403, naming ``rule``) unless ``actor`` holds ``duty``: the check for a rule
    inside an operation that more roles may call (e.g. policy text sent to ``validate``)."""
    role = actor_role(session, actor)
    if not holds(role, duty):
        raise Forbidden(
            f"{rule}: this needs the {duty.name} duty (roles {', '.join(sorted(duty))}); "
            f"{actor} has role {role or 'none'}",
            field=field,
            details={"rule": rule, "duty": duty.name, "role": role or None},
            audit_event={
                "actor": actor,
                "action": "duty.refused",
                "entity_type": "duty",
                "entity_id": duty.name,
                "payload": {"rule": rule, "duty": duty.name, "role": role or None},
            },
        )
