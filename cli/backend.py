"""The CLI's backend: embedded or remote, chosen by ``PAIRREG_URL`` (see ``api.backend``)."""

from api.backend import get_backend, local_backend

__all__ = ["get_backend", "local_backend"]
