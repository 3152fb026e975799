"""The real reference pair, built once into the test cache (minutes on two cores, then
reused: the build manifest's recipe digest decides whether a cached build is current)."""

from __future__ import annotations

import pytest

from tests.conftest import TEST_CACHE
from tests.core.conftest import cli  # noqa: F401 - re-exported pytest fixture
from tests.hubserver import hub_server  # noqa: F401 - re-exported pytest fixture


@pytest.fixture(scope="session")
def real():  # type: ignore[no-untyped-def]
    from runner.real import build_real_pair

    return build_real_pair(TEST_CACHE / "real")


@pytest.fixture
def no_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAIRREG_MLFLOW", "0")


@pytest.fixture(scope="session")
def real_heads(real):  # type: ignore[no-untyped-def]
    """EAGLE-1 and EAGLE-3 heads for the real target-v1: the heads stage of the same cache
    (its own marker, so the model build is kept)."""
    from runner.real_heads import build_real_heads

    return build_real_heads(real.root)
