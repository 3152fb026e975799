"""Runner test fixtures: the tiny pairs are built once into a stable cache directory
(``PAIRREG_TEST_CACHE`` or ``<repo>/.pairreg-test-cache``) and reused across sessions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from runner.tiny import TinyPaths, build_tiny_pairs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny() -> TinyPaths:
    cache = Path(os.environ.get("PAIRREG_TEST_CACHE", str(REPO / ".pairreg-test-cache")))
    paths = build_tiny_pairs(cache / "tiny")
    # small models at batch size 1 run fastest on one thread (and suffer badly from
    # oversubscription when other processes share the cores)
    torch.set_num_threads(1)
    return paths
