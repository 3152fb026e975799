"""The real reference pair, built once into the test cache (minutes on two cores, then
reused: each recipe digest has its own cache directory, and the completion marker's digest
decides whether a build there is complete)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import TEST_CACHE
from tests.core.conftest import cli  # noqa: F401 - re-exported pytest fixture
from tests.hubserver import hub_server  # noqa: F401 - re-exported pytest fixture


@pytest.fixture(scope="session")
def real():  # type: ignore[no-untyped-def]
    from builders.real import build_real_pair, default_real_dir

    return build_real_pair(default_real_dir(TEST_CACHE))


@pytest.fixture(autouse=True)
def all_cores() -> Iterator[None]:
    """Real-pair tests decode a 135M model on every core: the session's default is one
    thread (right for the tiny models, ``tests/__init__.py``), on which the real flow took
    1.4x as long on an idle machine. They run last; when the background build or the other
    pytest worker still shares the cores, passive OpenMP waits keep two threads
    about as fast as one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAIRREG_MLFLOW", "0")


@pytest.fixture(scope="session")
def real_heads(real):  # type: ignore[no-untyped-def]
    """EAGLE-1 and EAGLE-3 heads for the real target-v1: the heads stage of the same cache
    (its own marker, so the model build is kept)."""
    from builders.real_heads import build_real_heads

    return build_real_heads(real.root)
