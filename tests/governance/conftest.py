"""Governance fixtures: the tiny reference pairs (built once into the shared test cache),
the in-process ``pairreg`` runner, and a small policy so the flow runs in seconds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.core.conftest import cli  # noqa: F401 - re-exported pytest fixture
from tests.hubserver import hub_server  # noqa: F401 - re-exported pytest fixture

REPO = Path(__file__).resolve().parents[2]
POLICY = Path(__file__).with_name("policy_tiny.toml")


def cache_dir() -> Path:
    return Path(os.environ.get("PAIRREG_TEST_CACHE") or REPO / ".pairreg-test-cache")


@pytest.fixture(scope="session")
def tiny():  # type: ignore[no-untyped-def]
    """Paths of the tiny pairs (target-v1, target-v2, draft, medusa), built once."""
    from runner import build_tiny_pairs

    return build_tiny_pairs(cache_dir() / "tiny")


@pytest.fixture
def no_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAIRREG_MLFLOW", "0")
