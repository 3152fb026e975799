"""The CLI's backend: embedded or remote, chosen by ``PAIRREG_URL`` (see ``api.backend``)."""

import os

from api.backend import get_backend, local_backend
from registry.settings import get_settings

__all__ = ["get_backend", "local_backend", "user_path"]


def user_path(value: str) -> str:
    """A path typed by the local user, with ``~`` expanded as their shell would.

    Only embedded, where the CLI acts as that user on this machine: the operations take
    paths literally, and a server must never expand a client's ``~`` into its own account's
    home. Remote, the path goes to the server as typed.
    """
    if get_settings().url or not value.startswith("~"):
        return value
    return os.path.expanduser(value)
