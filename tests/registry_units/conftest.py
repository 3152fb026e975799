"""Fixtures for the pure registry building blocks (no database)."""

from tests.hubserver import hub_server  # noqa: F401 - re-exported pytest fixture
