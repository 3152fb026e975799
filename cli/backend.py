"""Choosing embedded or remote mode: one object whose methods are the service operations.

Embedded (``PAIRREG_URL`` unset): each call runs the named service in its own transaction
on the local database. Remote: ``api.client.PairregClient`` has methods of the same names
and signatures and returns the same record classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry import db
from registry.services import OPERATIONS
from registry.services.base import takes_actor
from registry.services.system import os_actor, read_credentials
from registry.settings import Settings, get_settings


class LocalBackend:
    """Service operations on the embedded database, acting as the OS user."""

    mode = "embedded"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.url = settings.db_url
        self.actor = os_actor()
        self._schema_checked = False

    def check_schema(self) -> None:
        if not self._schema_checked:
            db.require_current_schema(self.url)
            self._schema_checked = True

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = OPERATIONS.get(name)
        if fn is None:
            raise AttributeError(name)

        def call(**kwargs: Any) -> Any:
            self.check_schema()
            if takes_actor(fn):
                kwargs.setdefault("actor", self.actor)
            with db.session_scope(self.url) as session:
                return fn(session, **kwargs)

        return call


def get_backend(settings: Settings | None = None) -> Any:
    settings = settings or get_settings()
    if settings.url:
        from api.client import PairregClient

        token = settings.token
        if not token:
            creds = read_credentials(settings.credentials_path) or {}
            token = creds.get("token")
        return PairregClient(settings.url, token=token)
    return LocalBackend(settings)
