"""Local paths a caller names for the server to read: taken literally, confined when remote.

A path in a request is the caller's words, not a shell's: ``~`` is not expanded (on a
server it would name the *server account's* home, and ``~unknown`` cannot be resolved at
all), so ``"~0"`` is a relative directory called ``~0`` like any other name. The embedded
CLI, acting as the local user, expands ``~`` itself before it calls an operation.

Who is asking decides what may be read, in one place: :func:`path_limits` turns the edge's
"remote or not" into a :class:`PathLimits` (remote: the configured artifact roots and the
file-count and size limits) or ``None`` (the embedded CLI: whatever the local user can
read). Services take that value as an ordinary parameter filled by the edge
(``registry.contract.operations``), never from the caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from registry.errors import InvalidInput
from registry.settings import Settings


@dataclass(frozen=True)
class PathLimits:
    """What a remote caller may make the server read: directories under ``roots`` (after
    resolving every symlink), at most ``max_files`` files and ``max_bytes`` bytes."""

    roots: tuple[Path, ...]
    max_files: int
    max_bytes: int

    def confine(self, resolved: Path, *, field: str, shown: str) -> None:
        """Refuse ``resolved`` (already symlink-free) unless it lies under a root."""
        for root in self.roots:
            real_root = os.path.realpath(root)
            if _within(str(resolved), real_root):
                return
        roots = ", ".join(str(r) for r in self.roots)
        raise InvalidInput(
            f"{field} {shown!r} is outside the server's artifact roots ({roots}); a remote "
            "client may only name directories under them (PAIRREG_ARTIFACT_ROOTS)",
            field=field,
        )

    def symlink_root(self, wanted: Path) -> Path | None:
        """``wanted`` when it lies under a root, else ``None`` (the hashed directory)."""
        real = os.path.realpath(wanted)
        if any(_within(real, os.path.realpath(r)) for r in self.roots):
            return wanted
        return None


def path_limits(settings: Settings, *, remote: bool) -> PathLimits | None:
    """The single decision: a remote caller is confined, the local user is not."""
    if not remote:
        return None
    return PathLimits(
        roots=settings.artifact_root_dirs,
        max_files=settings.max_source_files,
        max_bytes=settings.max_source_bytes,
    )


def _within(target: str, root: str) -> bool:
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def resolve_literal(value: str, *, field: str, limits: PathLimits | None) -> Path:
    """``value`` as a path, taken literally, fully resolved, and (remote) confined.

    Confinement is checked before existence, so a remote caller learns nothing about
    what exists outside the roots. Anything that cannot be resolved (a symlink loop, a NUL
    byte, an unreadable parent) is the caller's input: a 422 naming ``field``.
    """
    if "\x00" in value:
        raise InvalidInput(f"{field} {value!r} cannot be resolved: NUL byte", field=field)
    try:
        resolved = Path(value).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise InvalidInput(f"{field} {value!r} cannot be resolved: {exc}", field=field) from exc
    if limits is not None:
        limits.confine(resolved, field=field, shown=value)
    return resolved


def local_directory(value: str, *, field: str, limits: PathLimits | None) -> Path:
    """An existing directory named by ``value`` (see :func:`resolve_literal`)."""
    resolved = resolve_literal(value, field=field, limits=limits)
    try:
        exists, is_dir = resolved.exists(), resolved.is_dir()
    except OSError as exc:
        raise InvalidInput(f"{field} {value!r} cannot be read: {exc}", field=field) from exc
    if not exists:
        raise InvalidInput(f"{field} path {value} does not exist", field=field)
    if not is_dir:
        raise InvalidInput(f"{field} path {value} is not a directory", field=field)
    return resolved


def local_file(value: str, *, field: str, limits: PathLimits | None) -> Path:
    """An existing regular file named by ``value`` (see :func:`resolve_literal`)."""
    resolved = resolve_literal(value, field=field, limits=limits)
    try:
        is_file = resolved.is_file()
    except OSError as exc:
        raise InvalidInput(f"{field} {value!r} cannot be read: {exc}", field=field) from exc
    if not is_file:
        raise InvalidInput(f"{field}: no file at {value}", field=field)
    return resolved
