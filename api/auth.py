"""Bearer-token authentication and role checks, as FastAPI dependencies.

The operation routes remember who a token is for ``PAIRREG_TOKEN_CACHE_SECONDS`` (2 s by
default; 0 turns it off), keyed by the secret's SHA-256 as the database keys it: under load
most requests come from a few tokens, and looking each one up again cost a worker thread, a
pooled connection and a transaction per request, a third of a look-up's work. A token
revoked or created through this server takes effect at once (every token write empties the
cache, :func:`after_write`); one revoked through another replica or the CLI is refused here
within those seconds. Unknown or revoked tokens are never remembered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from api.lanes import lanes
from registry.contract.spec import Operation
from registry.db import transact
from registry.errors import Forbidden, Unauthorized
from registry.services.tokens import authenticate, hash_secret

_bearer = HTTPBearer(auto_error=False, description="A pairreg API token (prt_…).")


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    @property
    def actor(self) -> str:
        return f"token:{self.name}"


@dataclass
class TokenCache:
    """Principals of recently presented tokens, by the secret's hash, for ``ttl`` seconds."""

    ttl: float
    _entries: dict[str, tuple[float, Principal]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, key: str) -> Principal | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key: str, principal: Principal) -> None:
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._entries) > 10_000:  # bounded: forget everything rather than grow
                self._entries.clear()
            self._entries[key] = (time.monotonic() + self.ttl, principal)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _credentials(credentials: HTTPAuthorizationCredentials | None) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    return credentials.credentials


def _lookup(db_url: str, secret: str) -> Principal:
    def find(session: Session) -> Principal:
        tok = authenticate(session, secret)
        return Principal(tok.name, tok.role)

    return transact(db_url, find, read_only=True, what="token check")


def _admit(principal: Principal, roles: frozenset[str]) -> Principal:
    if principal.role not in roles:
        raise Forbidden(
            f"role {principal.role} may not do this; allowed: {', '.join(sorted(roles))}"
        )
    return principal


def _principal(
    db_url: str, credentials: HTTPAuthorizationCredentials | None, roles: frozenset[str]
) -> Principal:
    return _admit(_lookup(db_url, _credentials(credentials)), roles)


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
        secret = _credentials(credentials)
        cache: TokenCache = request.app.state.token_cache
        key = hash_secret(secret)
        principal = cache.get(key)
        if principal is None:
            principal = await lanes(request).read.run(_lookup, request.app.state.db_url, secret)
            cache.put(key, principal)
        return _admit(principal, roles)

    return dependency


def after_write(request: Request, op: Operation) -> None:
    """A token created or revoked through this server counts from the next request."""
    if op.tag == "tokens" and op.method != "GET":
        request.app.state.token_cache.clear()
