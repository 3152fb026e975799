"""Two lanes of worker threads for the operation routes: reads apart from writes.

The routes' service calls are synchronous (SQLAlchemy sessions), so each runs on a worker
thread. Left to Starlette's one shared pool (anyio's default limiter, 40 threads), a burst
of writes takes every thread: writers serialise on the registry's write lock (the audit
sequence is gapless), so all but one sit in a thread *and* a pooled database connection
waiting for that lock, and a look-up that needs a thread and a connection for a few
milliseconds waits behind them (under the load benchmark: 28 of 40 threads on the lock, 7
more waiting for the connection pool, p99 look-up 0.4-0.8 s).

Here an operation runs in the lane of its kind: ``GET`` operations in the read lane, every
other method in the write lane (its GET alias too, e.g. a full audit log verification).
Each lane is a capacity limiter of its own size; a call waiting for a place waits in the
event loop, holding neither a thread nor a connection. Writes beyond
``PAIRREG_WRITE_CONCURRENCY`` queue there (in arrival order) rather than each holding a
thread and a connection to wait on the lock, so a read is never queued behind writes;
reads get ``PAIRREG_READ_CONCURRENCY`` threads of their own (8 by default: reads are mostly
Python under one interpreter lock, and more threads add switching, not throughput). Both
together (at most 20 + 6, see ``registry.settings``) stay under the database pool
(``registry.db``: 20 kept + 10 overflow), so a lane's call does not wait for a connection
and a few are left for the other routes and the embedded worker.

With ``PAIRREG_WRITE_PROCESSES`` > 0 the write lane runs its operations in worker
processes instead (``api/write_pool.py``): the same limiter admits them, so at most
``PAIRREG_WRITE_CONCURRENCY`` are handed to the pool at once and the rest wait in the event
loop as before.

Embedded serving (``api/serving.py``) has a third lane, ``serve``, as wide as
``PAIRREG_SERVE_MAX_GENERATIONS`` (the generation slots refuse anything beyond it, so a
generation never waits here): a model generating for seconds holds a serve thread, never a
read or write one.

A limiter belongs to one event loop, so each lane keeps one per running loop (tests run
apps under several).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import HTTPConnection

from registry.contract.spec import Operation
from registry.settings import Settings

if TYPE_CHECKING:
    from api.write_pool import WritePool

T = TypeVar("T")
LaneName = Literal["read", "write", "serve"]


@dataclass
class Lane:
    """A bounded number of worker threads; callers beyond it wait without a thread."""

    name: LaneName
    size: int
    pool: WritePool | None = None  # worker processes instead of threads (writes only)
    running: int = 0  # calls in a thread (or a worker process) now
    peak: int = 0  # most calls in a thread at once (tests, diagnostics)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False
    )

    def limiter(self) -> anyio.CapacityLimiter:
        loop = asyncio.get_running_loop()
        lim = self._limiters.get(loop)
        if lim is None:
            lim = self._limiters[loop] = anyio.CapacityLimiter(self.size)
        return lim

    @property
    def waiting(self) -> int:
        """Calls waiting for a place, over every loop."""
        return sum(lim.statistics().tasks_waiting for lim in list(self._limiters.values()))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        def counted() -> T:
            with self._lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self.running -= 1

        return await anyio.to_thread.run_sync(counted, limiter=self.limiter())

    async def run_operation(self, settings: Settings, op: Operation, values: dict[str, Any]) -> Any:
        """Run a contract operation (``api.operations.execute``) in this lane."""
        from api.operations import execute

        if self.pool is None:
            return await self.run(execute, settings, op, values)
        async with self.limiter():
            with self._lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
            try:
                return await self.pool.run(op.name, values)
            finally:
                with self._lock:
                    self.running -= 1


def _serve_lane() -> Lane:
    return Lane("serve", 4)


@dataclass
class Lanes:
    read: Lane
    write: Lane
    # embedded serving's generations (api/serving.py): minutes of model work must not take
    # the threads that reads and writes run in, nor wait behind them
    serve: Lane = field(default_factory=_serve_lane)

    @classmethod
    def from_settings(cls, settings: Settings) -> Lanes:
        pool = None
        if settings.write_processes > 0:
            from api.write_pool import WritePool

            pool = WritePool(settings, settings.write_processes, settings.write_nice)
        return cls(
            read=Lane("read", settings.read_concurrency),
            write=Lane("write", settings.write_concurrency, pool=pool),
            serve=Lane("serve", settings.serve_max_generations),
        )

    def close(self) -> None:
        """Stop the write lane's worker processes, if any, after the writes in flight."""
        if self.write.pool is not None:
            self.write.pool.shutdown()

    def for_method(self, method: str) -> Lane:
        return self.read if method.upper() == "GET" else self.write


def lanes(conn: HTTPConnection) -> Lanes:
    """The lanes of the app serving ``conn``."""
    return conn.app.state.lanes  # type: ignore[no-any-return]
