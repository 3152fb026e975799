"""Fixtures for the trust tests: the in-process API and the served registry of other areas."""

from tests.api.conftest import api  # noqa: F401 - re-exported pytest fixture
from tests.core.conftest import cli  # noqa: F401 - re-exported pytest fixture
from tests.requests.conftest import served  # noqa: F401 - re-exported pytest fixture
