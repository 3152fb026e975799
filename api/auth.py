"""Bearer-token authentication and role checks, as FastAPI dependencies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.lanes import lanes
from registry.db import session_scope
from registry.errors import Forbidden, Unauthorized
from registry.services.tokens import authenticate

_bearer = HTTPBearer(auto_error=False, description="A pairreg API token (prt_…).")


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"token:{self.name}"


def _principal(
    db_url: str, credentials: HTTPAuthorizationCredentials | None, roles: frozenset[str]
) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    with session_scope(db_url) as session:
        tok = authenticate(session, credentials.credentials)
        principal = Principal(tok.name, tok.role)
    if principal.role not in roles:
        raise Forbidden(
            f"role {principal.role} may not do this; allowed: {', '.join(sorted(roles))}"
        )
    return principal


def require(roles: frozenset[str]) -> Callable[..., Principal]:
    """A dependency that authenticates the caller and admits only ``roles``."""

    def dependency(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    ) -> Principal:
        return _principal(request.app.state.db_url, credentials, roles)

    return dependency


def require_in_read_lane(roles: frozenset[str]) -> Callable[..., Awaitable[Principal]]:
    """:func:`require` for the operation routes: the token look-up is a read, so it runs
    in the app's read lane (api/lanes.py) and never waits behind writes for a thread."""

    async def dependency(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    ) -> Principal:
        return await lanes(request).read.run(
            _principal, request.app.state.db_url, credentials, roles
        )

    return dependency
