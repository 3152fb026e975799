"""Choosing the backend: the embedded registry, or a pairreg server over HTTP.

Both satisfy :class:`registry.contract.interface.Backend`, so callers (the CLI, the proxy,
workers) are written once against that typed interface.
"""

from __future__ import annotations

from typing import cast

from registry.contract.interface import Backend
from registry.contract.local import LocalBackend
from registry.services.system import os_actor, read_credentials
from registry.settings import Settings, get_settings


def local_backend(settings: Settings, actor: str | None = None) -> Backend:
    """The embedded registry, acting as ``actor`` (default: the OS user)."""
    return cast(Backend, LocalBackend(settings, actor or os_actor()))


def remote_backend(url: str, token: str | None) -> Backend:
    from api.client import PairregClient

    return cast(Backend, PairregClient(url, token=token))


def get_backend(settings: Settings | None = None) -> Backend:
    """Remote when ``PAIRREG_URL`` is set (token from ``PAIRREG_TOKEN`` or the credentials
    file), embedded otherwise."""
    settings = settings or get_settings()
    if settings.url:
        token = settings.token
        if not token:
            creds = read_credentials(settings.credentials_path) or {}
            token = creds.get("token")
        return remote_backend(settings.url, token)
    return local_backend(settings)
