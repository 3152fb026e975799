"""Fixtures for the fault tests: the in-process ``pairreg`` runner."""

from tests.core.conftest import cli  # noqa: F401 - re-exported pytest fixture
