"""Build what the slow fixtures need before the tests ask for it: the tiny pairs (both
stages) and the MLflow server's virtual environment, each cached across runs.

``make test`` starts this in the background before lint, and the tests that need either
asset are collected last (``tests/conftest.py``), so on a new machine the three minutes of
building overlap the seven hundred tests that need neither, instead of holding both pytest
workers at a lock. Everything here is idempotent and takes the same file locks the fixtures
take: a fixture that asks first builds, the other waits, and a finished build is reused.

Run it by hand with ``python -m tests.prepare``.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from builders.settings import cache_root

# The reference builds' cache root: PAIRREG_TEST_CACHE, else the builders' own (the user
# cache directory or PAIRREG_BUILD_CACHE), so every clone and CI run on one machine reuses
# one build per recipe digest (``builders.settings``).
TEST_CACHE = Path(os.environ.get("PAIRREG_TEST_CACHE") or cache_root())
MLFLOW_SPEC = "mlflow==3.17.*"


def mlflow_server_venv() -> Path:
    """The virtual environment the MLflow-in tests run ``mlflow server`` from (full MLflow
    is not a pairreg dependency, see ``tests/lifecycle/conftest.py``), built once."""
    override = os.environ.get("PAIRREG_MLFLOW_SERVER_VENV")
    venv = Path(override) if override else TEST_CACHE / "mlflow-server-3.17"
    if (venv / "bin" / "mlflow").exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / ".mlflow-server.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "bin" / "mlflow").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run(
                # compiled at install: with PYTHONDONTWRITEBYTECODE set, nothing compiled
                # later is kept, and every server start would compile mlflow again
                [str(venv / "bin" / "pip"), "install", "-q", MLFLOW_SPEC],
                check=True,
                timeout=900,
            )
    return venv


def tiny_pairs():  # type: ignore[no-untyped-def]
    """The tiny pairs' paths, built into the test cache if they are not there yet."""
    from builders.tiny import build_tiny_pairs, default_tiny_dir

    return build_tiny_pairs(default_tiny_dir(TEST_CACHE))


def main() -> int:
    started = time.monotonic()
    errors: list[BaseException] = []

    def venv() -> None:
        try:
            print(f"mlflow server venv: {mlflow_server_venv()}", flush=True)
        except BaseException as exc:  # reported below; the fixture will retry and fail loudly
            errors.append(exc)

    thread = threading.Thread(target=venv)
    thread.start()
    print(f"tiny pairs: {tiny_pairs().root}", flush=True)
    thread.join()
    for exc in errors:
        print(f"mlflow server venv failed: {exc!r}", file=sys.stderr)
    print(f"prepared in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
