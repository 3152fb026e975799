"""The client-side request tagger: serving code calls ``tag()``, which never waits on the network.

Import cost is the stdlib plus ``httpx`` (no torch, no registry), so any serving process can
use it::

    tagger = Tagger("http://pairreg:8000", token, "/var/spool/pairreg")
    tagger.tag(request_id, "chat-prod", input_tokens=12, output_tokens=80)   # ~µs
    ...
    tagger.close()                                   # on shutdown: spool, ship, wait

How a tag travels:

1. ``tag()`` appends a dict to an in-memory queue and returns.
2. The *spooler* thread drains the queue every ``flush_interval`` seconds (or at
   ``batch_size`` tags) into one spool file per batch: written to ``*.tmp``, fsynced, renamed,
   directory fsynced. From here on the batch survives a crash of this process or the host.
3. The *sender* thread POSTs spool files to ``/v1/requests`` oldest first and deletes each
   only after a 2xx. Network errors, 5xx, 401/403/429 are retried with capped exponential
   backoff, forever: the spool is the buffer. The server stores every tag of a batch that
   does not conflict and lists each conflicting one (a different tag already recorded under
   its id by this token): only those tags go to ``rejected/``, with the server's answer next
   to them (``stats["conflicts"]`` counts the tags). A 4xx that names one tag
   (``field: tags.<i>…``, e.g. a 422 for a tag whose pair digest is unknown) sets that tag
   aside and re-sends the rest at once; a 409 or 422 that names no tag cannot succeed by
   retrying: the whole file goes to ``rejected/``. ``stats["rejected"]`` counts the batches
   (or parts of batches) set aside.
4. A new Tagger on the same directory replays what is left, so a restart loses nothing that
   reached step 2.

Delivery guarantee: every tag that reached the spool is delivered at least once; the server
is idempotent by request id, so each is *recorded* exactly once. Tags still in memory (at most
``flush_interval`` seconds or ``batch_size`` tags) are lost if the process is killed before
``close()``/``flush()``.

When the spool disk is full (or unwritable): the batch stays in memory and the sender ships
it straight from there; if the server is also unreachable, tags accumulate in memory up to
``max_pending``, after which ``tag()`` drops new tags (returns ``False`` and counts
``stats["dropped"]``) rather than block or exhaust memory. ``stats["spool_errors"]`` counts
failed writes; watch it.

One Tagger per spool directory: a second process opening the same directory gets an error.
"""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("pairreg.tagger")

RETRYABLE = {401, 403, 408, 425, 429}


def _now() -> str:
    return datetime.now(UTC).isoformat()


class TaggerError(Exception):
    pass


def _json_or_empty(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _is_index(conflict: Any, n: int) -> bool:
    return (
        isinstance(conflict, dict)
        and isinstance(conflict.get("index"), int)
        and (0 <= conflict["index"] < n)
    )


def _tag_index(field: Any, n: int) -> int | None:
    """The batch position a problem's ``field`` names (``tags.3.pair_digest``), if any."""
    if not isinstance(field, str):
        return None
    parts = field.split(".")
    if len(parts) < 2 or parts[0] != "tags" or not parts[1].isdigit():
        return None
    i = int(parts[1])
    return i if i < n else None


class Tagger:
    """See the module docstring. Thread-safe; ``tag()`` may be called from any thread."""

    def __init__(
        self,
        url: str,
        token: str | None,
        spool_dir: str | os.PathLike[str],
        *,
        batch_size: int = 1000,
        flush_interval: float = 0.2,
        max_pending: int = 100_000,
        timeout: float = 30.0,
        max_backoff: float = 5.0,
        start: bool = True,
    ):
        if not 1 <= batch_size <= 10_000:
            raise ValueError("batch_size must be 1..10000 (the server's batch limit)")
        self.url = url.rstrip("/")
        self.spool = Path(spool_dir)
        self.rejected_dir = self.spool / "rejected"
        self.rejected_dir.mkdir(parents=True, exist_ok=True)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.max_pending = max_pending
        self.max_backoff = max_backoff
        self._lock_fh = open(self.spool / ".lock", "w")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_fh.close()
            raise TaggerError(f"spool {self.spool} is in use by another tagger") from exc
        for leftover in self.spool.glob("*.tmp"):  # never renamed: never durable
            leftover.unlink(missing_ok=True)
        self._queue: collections.deque[dict[str, Any]] = collections.deque()
        self._memory: collections.deque[tuple[str, list[dict[str, Any]]]] = collections.deque()
        self._seq = max((int(p.stem) for p in self._spool_files()), default=0)
        self._in_memory_tags = 0
        self._stop = threading.Event()
        self._wake_spooler = threading.Event()
        self._wake_sender = threading.Event()
        self._sending = False
        self._spooling = False
        self._closed = False
        self.stats = {
            "tagged": 0,
            "dropped": 0,
            "spooled_batches": 0,
            "sent_batches": 0,
            "sent_tags": 0,
            "rejected": 0,
            "conflicts": 0,
            "spool_errors": 0,
            "send_errors": 0,
        }
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._threads = [
            threading.Thread(target=self._spool_loop, name="pairreg-tagger-spool", daemon=True),
            threading.Thread(target=self._send_loop, name="pairreg-tagger-send", daemon=True),
        ]
        if start:
            self.start()

    # -- the hot path ---------------------------------------------------------------------

    def tag(
        self,
        request_id: str,
        deployment: str,
        *,
        served_at: datetime | str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        pair_digest: str | None = None,
        spec: dict[str, Any] | None = None,
    ) -> bool:
        """Queue one tag; False when it was dropped because ``max_pending`` tags are waiting."""
        if len(self._queue) + self._in_memory_tags >= self.max_pending:
            self.stats["dropped"] += 1
            return False
        item: dict[str, Any] = {
            "request_id": request_id,
            "deployment": deployment,
            "served_at": served_at.isoformat()
            if isinstance(served_at, datetime)
            else (served_at or _now()),
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
        }
        if pair_digest:
            item["pair_digest"] = pair_digest
        if spec:
            item["spec"] = spec
        self._queue.append(item)
        self.stats["tagged"] += 1
        if len(self._queue) >= self.batch_size:
            self._wake_spooler.set()
        return True

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        for t in self._threads:
            if not t.is_alive():
                t.start()

    def pending(self) -> int:
        """Tags not yet acknowledged by the server (queued, in memory or spooled)."""
        spooled = 0
        for path in self._spool_files():
            try:
                spooled += len(json.loads(path.read_text())["tags"])
            except (OSError, ValueError, KeyError):
                continue
        return len(self._queue) + self._in_memory_tags + spooled

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every tag so far is acknowledged; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._wake_spooler.set()
            self._wake_sender.set()
            # Order matters: each flag is raised before the state it guards is emptied.
            idle = not self._queue and not self._spooling and not self._memory
            if idle and not self._sending and not self._spool_files():
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def close(self, timeout: float = 10.0) -> bool:
        """Spool everything, try to ship it for up to ``timeout`` s, stop. What is not shipped
        stays in the spool for the next Tagger on this directory. Idempotent."""
        if self._closed:
            return not self._spool_files()
        self._closed = True
        self._spool_all()
        done = self.flush(timeout)
        self._stop.set()
        self._wake_spooler.set()
        self._wake_sender.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=5)
        self._spool_all()
        self._http.close()
        fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
        self._lock_fh.close()
        return done

    def __enter__(self) -> Tagger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- spooler --------------------------------------------------------------------------

    def _spool_files(self) -> list[Path]:
        return sorted(p for p in self.spool.glob("*.json") if p.stem.isdigit())

    def _take(self) -> list[dict[str, Any]]:
        batch = []
        while self._queue and len(batch) < self.batch_size:
            batch.append(self._queue.popleft())
        return batch

    def _spool_all(self) -> None:
        while self._queue:
            self._spool_batch(self._take())

    def _spool_batch(self, batch: list[dict[str, Any]]) -> None:
        if not batch:
            return
        self._seq += 1
        name = f"{self._seq:012d}"
        data = json.dumps({"id": uuid.uuid4().hex, "tags": batch}).encode()
        tmp = self.spool / f"{name}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.spool / f"{name}.json")
            dir_fd = os.open(self.spool, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            self.stats["spooled_batches"] += 1
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self.stats["spool_errors"] += 1
            log.warning("spool write failed (%s); keeping %d tags in memory", exc, len(batch))
            self._in_memory_tags += len(batch)
            self._memory.append((name, batch))
        self._wake_sender.set()

    def _spool_loop(self) -> None:
        while not self._stop.is_set():
            self._wake_spooler.wait(self.flush_interval)
            self._wake_spooler.clear()
            while self._queue and not self._stop.is_set():
                self._spooling = True
                try:
                    self._spool_batch(self._take())
                finally:
                    self._spooling = False

    # -- sender ---------------------------------------------------------------------------

    def _post(self, tags: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
        """('ok' | 'retry' | 'reject', detail, the server's JSON answer or {})."""
        try:
            resp = self._http.post("/v1/requests", json={"tags": tags})
        except httpx.HTTPError as exc:
            return "retry", f"{type(exc).__name__}: {exc}", {}
        if resp.status_code < 300:
            return "ok", "", _json_or_empty(resp)
        if resp.status_code in (409, 422):
            return "reject", f"HTTP {resp.status_code}: {resp.text[:4000]}", _json_or_empty(resp)
        return "retry", f"HTTP {resp.status_code}: {resp.text[:200]}", {}

    def _deliver(self, name: str, tags: list[dict[str, Any]]) -> tuple[str, str]:
        """Send one batch until every tag is stored, a duplicate, or set aside; ('ok' |
        'retry' | 'reject', detail). 'retry' means nothing was settled: the whole batch goes
        again later (the server is idempotent, so tags it already stored are no-ops)."""
        part = 0
        while True:
            outcome, detail, answer = self._post(tags)
            if outcome == "retry":
                return outcome, detail
            if outcome == "ok":
                conflicts = answer.get("conflicts") or []
                idx = sorted({int(c["index"]) for c in conflicts if _is_index(c, len(tags))})
                if idx:
                    self.stats["conflicts"] += len(idx)
                    self._reject(
                        f"{name}-conflicts",
                        [tags[i] for i in idx],
                        "stored every other tag of the batch; these request ids hold a "
                        f"different tag already: {json.dumps(conflicts)[:4000]}",
                    )
                return "ok", ""
            i = _tag_index(answer.get("field"), len(tags))
            if i is None or len(tags) == 1:
                self._reject(name if part == 0 else f"{name}-{part}", tags, detail)
                return "reject", detail
            part += 1  # one tag the server named: set it aside, send the rest now
            self._reject(f"{name}-{part}", [tags[i]], detail)
            tags = tags[:i] + tags[i + 1 :]

    def _reject(self, name: str, tags: list[dict[str, Any]], detail: str) -> None:
        self.stats["rejected"] += 1
        log.error("batch %s rejected by the server: %s", name, detail[:300])
        try:
            (self.rejected_dir / f"{name}.json").write_text(json.dumps({"tags": tags}))
            (self.rejected_dir / f"{name}.error.txt").write_text(detail)
        except OSError:
            pass

    def _send_one(self) -> str | None:
        """Ship the oldest batch; the outcome, or None when there is nothing to send."""
        if self._memory:
            name, tags = self._memory[0]
            outcome, detail = self._deliver(name, tags)
            if outcome != "retry":
                self._memory.popleft()
                self._in_memory_tags -= len(tags)
            return self._count(outcome, len(tags), detail)
        files = self._spool_files()
        if not files:
            return None
        path = files[0]
        try:
            tags = json.loads(path.read_text())["tags"]
        except (OSError, ValueError, KeyError) as exc:
            self._reject(path.stem, [], f"unreadable spool file: {exc}")
            path.unlink(missing_ok=True)
            return "reject"
        outcome, detail = self._deliver(path.stem, tags)
        if outcome != "retry":  # every tag stored, a duplicate, or kept in rejected/
            path.unlink(missing_ok=True)
        return self._count(outcome, len(tags), detail)

    def _count(self, outcome: str, n: int, detail: str) -> str:
        if outcome == "ok":
            self.stats["sent_batches"] += 1
            self.stats["sent_tags"] += n
        elif outcome == "retry":
            self.stats["send_errors"] += 1
            log.info("send failed, will retry: %s", detail)
        return outcome

    def _send_loop(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            self._sending = True
            try:
                outcome = self._send_one()
            except Exception:  # noqa: BLE001 - the sender must never die
                log.exception("tagger sender error")
                outcome = "retry"
            finally:
                self._sending = False
            if outcome is None:
                self._wake_sender.wait(self.flush_interval)
                self._wake_sender.clear()
            elif outcome == "retry":
                self._stop.wait(backoff)
                backoff = min(self.max_backoff, backoff * 2)
            else:
                backoff = 0.05
