"""Runner test fixtures: the shared tiny pairs, decoded on one thread."""

from __future__ import annotations

import pytest
import torch

from builders.tiny import TinyPaths


@pytest.fixture(scope="session")
def tiny(tiny: TinyPaths) -> TinyPaths:
    # small models at batch size 1 run fastest on one thread (and suffer badly from
    # oversubscription when other processes share the cores)
    torch.set_num_threads(1)
    return tiny
