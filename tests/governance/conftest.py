"""Governance fixtures: the in-process ``pairreg`` runner and a small policy so the flow runs in
seconds (the tiny reference pairs come from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.conftest import cli  # noqa: F401 - re-exported pytest fixture
from tests.hubserver import hub_server  # noqa: F401 - re-exported pytest fixture

POLICY = Path(__file__).with_name("policy_tiny.toml")


@pytest.fixture
def no_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAIRREG_MLFLOW", "0")
