"""Write operations in worker processes, at a lower CPU priority than the reads.

Why: the API's services are synchronous Python, and one process shares one interpreter lock
among all of its threads. Under the load benchmark (``bench/load_bench.py``: 50 clients, 30%
writes) the writes held that lock about two thirds of the time: an ingest batch of 100 tags
is about 10 ms of Python, a registration 9 ms, a promotion 21 ms, and they run back to back
behind the registry's write lock. A look-up needs the interpreter a dozen times (each
database round trip gives it up), and waited behind them each time.

So, with ``PAIRREG_WRITE_PROCESSES`` > 0, the write lane (``api/lanes.py``) hands each
write operation to a pool of that many worker processes instead of a thread: the
operation's name and plain parameters go over a pipe, the child runs the very same service
in one transaction (``api.operations.execute``, with the same retries) and sends the result
back. The server process keeps HTTP, authentication, the reads and the responses, and its
interpreter lock is no longer the writes'. The children run at ``PAIRREG_WRITE_NICE`` (10 by
default) niceness: when the cores are short, the scheduler serves the reads first; writes,
which queue behind the write lock anyway, absorb the wait.

What crosses the pipe stays portable: a registry error (404, 409, 422 …) travels as itself;
a lost database or a full disk becomes an :class:`~registry.outages.OutageError` (503/507
with Retry-After, as in a thread); a value out of range for the database an
``OverflowError`` (422); anything else a ``RuntimeError`` naming the failure (500, logged
with its traceback by the child). A child that dies (killed, out of memory) answers its
in-flight requests 503 and the pool is replaced: each operation is one transaction, so a
write that did not answer either committed whole or stored nothing, and the client may send
it again (ingest is idempotent; a repeated promotion is 409 "already live").
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from registry import db
from registry.errors import PairregError
from registry.outages import Outage, OutageError, classify, data_paths
from registry.settings import Settings

logger = logging.getLogger("pairreg.api.write_pool")

# A child runs one transaction at a time: a couple of pooled connections are plenty (the
# server's own pool is sized for its lanes, registry.db.POOL_SIZE).
CHILD_POOL_SIZE = 2


class WritePool:
    """A process pool for write operations, replaced whole if a child dies."""

    def __init__(self, settings: Settings, processes: int, nice: int) -> None:
        self.settings = settings
        self.processes = processes
        self.nice = nice
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                # forkserver: children start from a clean interpreter (never a fork of a
                # process that already runs threads and an event loop) that has imported
                # the services once, so a replacement child starts in milliseconds.
                ctx = multiprocessing.get_context("forkserver")
                ctx.set_forkserver_preload(["api.write_pool"])
                self._executor = ProcessPoolExecutor(
                    self.processes,
                    mp_context=ctx,
                    initializer=_child_init,
                    initargs=(self.settings, self.nice, os.getpid()),
                )
            return self._executor

    def warm(self) -> None:
        """Start every child now (the server is about to take load), not on first use."""
        pool = self._pool()
        for f in [pool.submit(_child_ready) for _ in range(self.processes)]:
            f.result(timeout=120)

    async def run(self, name: str, values: Mapping[str, Any]) -> Any:
        """Run operation ``name`` with ``values`` in a child; its result or its error."""
        pool = self._pool()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                pool, _child_run, name, dict(values)
            )
        except BrokenProcessPool as exc:
            with self._lock:
                if self._executor is pool:
                    self._executor = None
            pool.shutdown(wait=False, cancel_futures=True)
            logger.error("%s: a write worker process died; the pool is replaced", name)
            raise OutageError(
                Outage(503, "unavailable", "Write worker lost", f"{name}: {exc}")
            ) from None

    def shutdown(self) -> None:
        """Let running writes finish, then stop the children."""
        with self._lock:
            pool, self._executor = self._executor, None
        if pool is not None:
            pool.shutdown(wait=True)

    def pids(self) -> list[int]:
        """The children's process ids (benchmarks count their memory and CPU)."""
        pool = self._executor
        procs = getattr(pool, "_processes", None) or {}
        return sorted(procs)


# --- in the child ---------------------------------------------------------------------

_settings: Settings | None = None


def _child_init(settings: Settings, nice: int, server_pid: int) -> None:
    global _settings
    _settings = settings
    # Ctrl-C in a terminal reaches the whole process group: the server decides when the
    # children stop (after the writes in flight), not the keyboard.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(
        target=_exit_with, args=(server_pid,), name="server-watch", daemon=True
    ).start()
    if nice:
        os.nice(nice)
    db.set_pool_size(CHILD_POOL_SIZE)
    from api import operations  # noqa: F401  (the contract and every service, loaded now)

    db.warm_pool(settings.db_url, CHILD_POOL_SIZE)
    gc.collect()
    gc.freeze()


def _exit_with(server_pid: int) -> None:
    """End this child when the server process ends, however it ends. A server killed
    outright never shuts its pool down, and the children, blocked on the task queue whose
    write end they hold themselves, would wait forever. A transaction in flight is rolled
    back by the database when the connection drops."""
    try:
        fd = os.pidfd_open(server_pid)
    except (AttributeError, OSError):  # no pidfd (not Linux, or an old kernel): poll
        while True:
            time.sleep(1.0)
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                os._exit(1)
    select.select([fd], [], [])  # readable once the process has exited
    os._exit(1)


def _child_ready() -> int:
    return os.getpid()


def _child_run(name: str, values: dict[str, Any]) -> Any:
    from api.operations import OPERATIONS_BY_NAME, execute

    assert _settings is not None, "write pool child not initialised"
    op = OPERATIONS_BY_NAME[name]
    try:
        return execute(_settings, op, values)
    except PairregError:
        raise
    except Exception as exc:
        raise _portable(exc, _settings) from None


def _portable(exc: Exception, settings: Settings) -> Exception:
    """An exception the server process can unpickle and answer as a thread would have."""
    outage = classify(exc, where=data_paths(settings))
    if outage is not None:
        return OutageError(outage)
    from sqlalchemy.exc import DataError

    if isinstance(exc, OverflowError | DataError):
        return OverflowError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    logger.exception("write operation failed in a worker process")
    return RuntimeError(f"{type(exc).__name__}: {exc}")
