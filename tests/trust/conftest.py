"""Fixtures for the trust tests: the in-process API from the API tests."""

from tests.api.conftest import api  # noqa: F401 - re-exported pytest fixture
