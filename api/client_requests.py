"""Remote-client methods for request tags, telemetry and audit reconstruction."""

from __future__ import annotations

from api.client_base import ClientBase


class RequestsClientMixin(ClientBase):
    """Methods mirror the service operations of the same names."""
