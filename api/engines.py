"""Loaded engines for embedded serving, one per pair digest per app.

A pair is loaded once: its artifacts are materialised (verified against their manifests,
so only registered bytes load), then the runner's ``build_engine`` builds exactly what a
measurement of the pair would run. Loading holds a lock of that pair's own, so a model
that takes a minute to load delays only the requests for it; generation is serialised
per engine by another lock, because an engine keeps one KV cache.

How much one process generates at once is bounded (:class:`GenerationSlots`): a request
takes a slot before it looks up or loads its engine and gives it back when its answer is
made; beyond ``serve_max_generations`` in all it is a 503, beyond
``serve_max_generations_per_token`` for its token a 429, both with ``Retry-After``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from registry.contract.interface import Backend
from registry.errors import InvalidInput, PairregError
from registry.governance.policy import measurement_settings
from registry.jobloop import Materialiser


class ServerBusy(PairregError):
    """Every generation slot of this process is taken (or loading a model)."""

    kind = "unavailable"
    status = 503
    title = "Busy"
    retry_after = 2


class TooManyGenerations(PairregError):
    """This token already has its share of the generation slots."""

    kind = "rate_limited"
    status = 429
    title = "Too many requests"
    retry_after = 1


class GenerationSlots:
    """Bounded generations in flight, in all and per token; never waits (refuses instead),
    so a flood of requests holds no thread, memory or model."""

    def __init__(self, total: int, per_token: int):
        self.total, self.per_token = total, per_token
        self._lock = threading.Lock()
        self._in_flight = 0
        self._by_token: dict[str, int] = {}

    @contextmanager
    def hold(self, who: str) -> Iterator[None]:
        with self._lock:
            # the caller's own share first: a 429 tells it that it is the one to slow down
            mine = self._by_token.get(who, 0)
            if mine >= self.per_token:
                raise TooManyGenerations(
                    f"{who} already has {mine} generations in flight (at most "
                    f"{self.per_token}): retry later",
                    field="model",
                )
            if self._in_flight >= self.total:
                raise ServerBusy(
                    f"{self._in_flight} generations in flight (the most this server runs at "
                    "once): retry later",
                    field="model",
                )
            self._in_flight += 1
            self._by_token[who] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                left = self._by_token[who] - 1
                if left:
                    self._by_token[who] = left
                else:
                    del self._by_token[who]


@dataclass
class Generation:
    text: str
    prompt_tokens: int
    run: Any  # runner.engine.PromptRun
    finish_reason: str = "length"

    @property
    def histogram(self) -> list[int]:
        """Steps that accepted exactly 0..k drafts, from per-position acceptance counts."""
        apos = list(self.run.accepted_per_position)
        if not apos:
            return []
        counts = [self.run.steps - apos[0]]
        counts += [apos[i] - apos[i + 1] for i in range(len(apos) - 1)]
        counts.append(apos[-1])
        return counts


class LoadedEngine:
    """A pair ready to generate (greedy)."""

    def __init__(
        self,
        pair_digest: str,
        built: Any,
        target_digest: str | None = None,
        draft_digest: str | None = None,
    ):
        self.pair_digest = pair_digest
        self.target_digest = target_digest
        self.draft_digest = draft_digest
        self.built = built
        self.lock = threading.Lock()

    def generate(
        self,
        prompt: str | list[dict[str, str]],
        max_tokens: int,
        on_text: Callable[[str], None] | None = None,
    ) -> Generation:
        """Raw text is encoded as the tokenizer does by default; a message list goes
        through the target's chat template with the generation prompt (as measured).

        ``on_text`` is handed the new text of each verified step as the runner yields it
        (under this engine's lock, so keep it quick); the pieces join to exactly the
        returned ``Generation.text``. A render error is raised before any piece."""
        from runner.render import RenderError, encode_prompt

        tok = self.built.tokenizer
        try:
            ids = encode_prompt(tok, prompt)
        except RenderError as exc:
            field = "prompt" if isinstance(prompt, str) else "messages"
            raise InvalidInput(str(exc), field=field) from exc
        text = IncrementalText(tok)
        with self.lock:
            steps = self.built.engine.stream(ids, max_new_tokens=max_tokens)
            while True:
                try:
                    new = next(steps)
                except StopIteration as end:
                    run = end.value
                    break
                piece = text.add(new)
                if piece and on_text is not None:
                    on_text(piece)
        final, rest = text.finish()
        if rest and on_text is not None:
            on_text(rest)
        stopped = bool(run.output_ids) and run.output_ids[-1] in self.built.eos
        return Generation(
            text=final, prompt_tokens=len(ids), run=run,
            finish_reason="stop" if stopped else "length",
        )  # fmt: skip


class IncrementalText:
    """Token ids in, new text out, so that the pieces join to the decoding of all the ids.

    Each step decodes everything so far (a byte-level BPE token may hold half a UTF-8
    character, and a tokenizer may join pieces differently than one by one) and hands out
    only what extends the text already handed out; a decoding that ends in U+FFFD (an
    unfinished character) waits for the next step. ``finish`` hands out the rest."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def _decode(self) -> str:
        return str(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        now = self._decode()
        if now.endswith("\ufffd") or not now.startswith(self.sent):
            return ""
        piece, self.sent = now[len(self.sent) :], now
        return piece

    def finish(self) -> tuple[str, str]:
        """(the whole text, the part not handed out yet)."""
        full = self._decode()
        rest = full[len(self.sent) :] if full.startswith(self.sent) else ""
        return full, rest


class EngineCache:
    def __init__(self, state_dir: Any):
        self.state_dir = state_dir
        self._engines: dict[str, LoadedEngine] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()  # the two dicts only, never held while loading

    def get(self, backend: Backend, pair_digest: str) -> LoadedEngine:
        with self._lock:
            engine = self._engines.get(pair_digest)
            if engine is not None:
                return engine
            loading = self._loading.setdefault(pair_digest, threading.Lock())
        with loading:  # one load per pair; requests for other pairs go on meanwhile
            with self._lock:
                engine = self._engines.get(pair_digest)
            if engine is None:
                engine = self._load(backend, pair_digest)  # a failure lets the next one try
                with self._lock:
                    self._engines[pair_digest] = engine
                    self._loading.pop(pair_digest, None)
            return engine

    def _load(self, backend: Backend, pair_digest: str) -> LoadedEngine:
        from runner import MeasureSettings
        from runner.build import build_engine

        pair = backend.get_pair(ref=pair_digest)
        dirs = Materialiser(backend, self.state_dir)
        target_dir = dirs.artifact(pair.target)
        drafter_dir = dirs.artifact(pair.drafter) if pair.drafter else None
        settings = measurement_settings(pair.config, {"temperature": 0.0})
        try:
            built = build_engine(MeasureSettings(**settings), target_dir, drafter_dir)
        except ValueError as exc:
            raise InvalidInput(
                f"cannot serve pair {pair_digest[:12]}: {exc}", field="model"
            ) from exc
        return LoadedEngine(
            pair_digest,
            built,
            pair.target.manifest_digest,
            pair.drafter.manifest_digest if pair.drafter else None,
        )


_CACHE_LOCK = threading.Lock()


def generation_slots(app: FastAPI) -> GenerationSlots:
    """The app's generation slots, sized from its settings on first use."""
    with _CACHE_LOCK:
        slots = getattr(app.state, "generation_slots", None)
        if slots is None:
            settings = app.state.settings
            slots = app.state.generation_slots = GenerationSlots(
                settings.serve_max_generations, settings.serve_max_generations_per_token
            )
        return slots


def engine_cache(app: FastAPI) -> EngineCache:
    """The app's engine cache (made on first use: an API that never serves loads no torch)."""
    with _CACHE_LOCK:
        cache = getattr(app.state, "engines", None)
        if cache is None:
            cache = app.state.engines = EngineCache(app.state.settings.cache_dir / "verified")
        return cache
