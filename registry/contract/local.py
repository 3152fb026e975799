"""The embedded backend: every operation run in-process against the local database.

It is the typed interface (:class:`registry.contract.interface.Backend`) for the CLI's
embedded mode and for the server's own worker. Each call validates its keyword arguments
with the operation's input model (the same constraints the HTTP edge applies), fills the
actor and the operation's context, and runs the service through the same
:func:`registry.contract.run.run` as the HTTP routes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry import db
from registry.contract.operations import BY_NAME
from registry.contract.run import run
from registry.contract.spec import CallContext
from registry.settings import Settings


class LocalBackend:
    """Service operations on the embedded database, acting as ``actor``."""

    mode = "embedded"

    def __init__(self, settings: Settings, actor: str, *, remote: bool = False):
        self.settings = settings
        self.url = settings.db_url
        self.actor = actor
        self.context = CallContext(settings=settings, remote=remote)
        self._schema_checked = False

    def check_schema(self) -> None:
        if not self._schema_checked:
            db.require_current_schema(self.url)
            self._schema_checked = True

    def close(self) -> None:
        """Nothing to release: sessions are per call."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        op = BY_NAME.get(name)
        if op is None:
            raise AttributeError(name)

        def call(**kwargs: Any) -> Any:
            values = op.check(kwargs)
            self.check_schema()
            return run(op, values, self.context, actor=self.actor)

        call.__name__ = name
        call.__doc__ = op.description
        return call
