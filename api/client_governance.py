"""Remote-client methods for governance: policies, validation, deployments, jobs, drift."""

from __future__ import annotations

from api.client_base import ClientBase


class GovernanceClientMixin(ClientBase):
    """Methods mirror the service operations of the same names."""
