"""Running a service from a route: one transaction, the caller as actor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request

from api.auth import Principal
from registry.db import session_scope
from registry.services.base import takes_actor

T = TypeVar("T")


def call(request: Request, principal: Principal, fn: Callable[..., T], **kwargs: Any) -> T:
    """Commit before the response is built, so a 2xx always means the change is durable."""
    if takes_actor(fn):
        kwargs["actor"] = principal.actor
    with session_scope(request.app.state.db_url) as session:
        return fn(session, **kwargs)
