"""Fixtures for the fault tests: the in-process ``pairreg`` runner, a SQLite home."""

from tests.api.conftest import sqlite_home  # noqa: F401 - re-exported pytest fixture
from tests.core.conftest import cli  # noqa: F401 - re-exported pytest fixture
