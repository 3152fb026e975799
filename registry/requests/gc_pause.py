"""Pause Python's cyclic garbage collector around a bulk step (ingest of one batch).

A 10,000-tag batch allocates some 100,000 container objects that all stay alive until the
batch is done. The cyclic collector runs every 700 net allocations and promotes them, then
walks the whole heap when enough have reached the oldest generation: on the ingest path
that cost more CPU than digesting the tags, and found nothing to collect. Reference
counting still frees everything as usual while paused; the collector resumes when the step
ends. Pauses nest and may overlap across threads: the collector is enabled again when the
last one ends, and only if it was enabled before the first.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


def pause() -> None:
    """Stop cyclic collection until the matching :func:`resume`."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1


def resume() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()


@contextmanager
def gc_paused() -> Iterator[None]:
    pause()
    try:
        yield
    finally:
        resume()
