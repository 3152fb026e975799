"""One helper for every reference build stage: cached, locked and keyed by its recipe.

A :class:`Stage` names everything that decides its output (its *recipe*, any JSON value;
a stage built on another one puts that stage's digest in its own recipe) and the files it
leaves. :meth:`Stage.run` builds into a directory unless a completion marker there
already names the recipe's digest and every output exists: concurrent builders (parallel
test sessions, a CLI run) wait on one file lock and then reuse the finished build instead
of writing the same files twice; a marker of another recipe (or a half-written build, which
has no marker) is rebuilt. Torch runs on a fixed number of threads with deterministic
algorithms while a stage builds, so its weights do not depend on the machine's cores.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ProgressFn = Callable[[str, int, int], None]


def recipe_digest(recipe: Mapping[str, Any]) -> str:
    """SHA-256 of the recipe's JSON with sorted keys (the form the builds have always used)."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Stage:
    """A cached build stage: ``recipe`` decides the outputs, ``marker`` records completion."""

    name: str
    recipe: Mapping[str, Any]
    marker: str
    outputs: tuple[str, ...] = field(default_factory=tuple)
    # markers of the stages built on this one's outputs: a rebuild removes them, so what
    # was trained on the replaced outputs is rebuilt too, even under the same recipes
    dependents: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        return recipe_digest(self.recipe)

    @property
    def key(self) -> str:
        """The directory name a build of this recipe gets in the cache."""
        return self.digest[:16]

    def read_marker(self, root: str | os.PathLike[str]) -> dict[str, Any] | None:
        try:
            meta = json.loads((Path(root) / self.marker).read_text())
        except (OSError, json.JSONDecodeError):
            return None
        return meta if isinstance(meta, dict) else None

    def is_built(self, root: str | os.PathLike[str]) -> bool:
        """The marker names this recipe's digest and every output exists."""
        meta = self.read_marker(root)
        return (
            meta is not None
            and meta.get("recipe_digest") == self.digest
            and all((Path(root) / out).exists() for out in self.outputs)
        )

    def run(
        self,
        root: str | os.PathLike[str],
        make: Callable[[Path], Mapping[str, Any]],
        *,
        threads: int | None = None,
        force: bool = False,
    ) -> bool:
        """Build into ``root`` with ``make(root)`` unless a build of this recipe is there;
        True when it built. ``make`` returns what the marker records beside the digest and
        the timings; torch runs on ``threads`` threads, deterministically, meanwhile."""
        root = Path(root)
        if not force and self.is_built(root):
            return False
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f".{self.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not force and self.is_built(root):
                    return False
                for marker in (self.marker, *self.dependents):
                    (root / marker).unlink(missing_ok=True)
                wall0, cpu0 = time.perf_counter(), time.process_time()
                with deterministic_torch(threads):
                    meta = dict(make(root))
                meta.update(
                    stage=self.name,
                    recipe_digest=self.digest,
                    wall_seconds=round(time.perf_counter() - wall0, 2),
                    cpu_seconds=round(time.process_time() - cpu0, 2),
                )
                meta.setdefault("recipe", self.recipe)
                meta.setdefault("torch", _torch_version())
                tmp = root / f".{self.marker}.tmp"
                tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
                os.replace(tmp, root / self.marker)
                return True
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def deterministic_torch(threads: int | None) -> Iterator[None]:
    """Torch on ``threads`` threads with deterministic algorithms, restored afterwards
    (nothing when ``threads`` is None: a stage that does not train)."""
    if threads is None:
        yield
        return
    import torch

    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)


def _torch_version() -> str | None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return str(torch.__version__)


class Ticker:
    """One progress count across the stages of a build: ``tick(stage)`` after each step
    calls ``progress(stage, done, total)`` so a CLI can draw one bar."""

    def __init__(self, progress: ProgressFn | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, stage: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(stage, self.done, self.total)


class Laps:
    """Wall seconds per named part of a stage (recorded in its marker)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._since, 2)
        self._since = now
