"""Loaded engines for embedded serving, one per pair digest per app.

A pair is loaded once: its artifacts are materialised (verified against their manifests,
so only registered bytes load), then the runner's ``build_engine`` builds exactly what a
measurement of the pair would run. Generation is serialised per engine by a lock, because
an engine keeps one KV cache.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from registry.contract.interface import Backend
from registry.errors import InvalidInput
from registry.jobloop import Materialiser
from registry.policy import measurement_settings


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

    def generate(self, prompt: str | list[dict[str, str]], max_tokens: int) -> Generation:
        """Raw text is encoded as the tokenizer does by default; a message list goes
        through the target's chat template with the generation prompt (as measured)."""
        from runner.render import RenderError, encode_prompt

        tok = self.built.tokenizer
        try:
            ids = encode_prompt(tok, prompt)
        except RenderError as exc:
            field = "prompt" if isinstance(prompt, str) else "messages"
            raise InvalidInput(str(exc), field=field) from exc
        with self.lock:
            run = self.built.engine.generate(ids, max_new_tokens=max_tokens)
        text = tok.decode(run.output_ids, skip_special_tokens=True)
        stopped = bool(run.output_ids) and run.output_ids[-1] in self.built.eos
        return Generation(
            text=text, prompt_tokens=len(ids), run=run,
            finish_reason="stop" if stopped else "length",
        )  # fmt: skip


class EngineCache:
    def __init__(self, state_dir: Any):
        self.state_dir = state_dir
        self._engines: dict[str, LoadedEngine] = {}
        self._lock = threading.Lock()

    def get(self, backend: Backend, pair_digest: str) -> LoadedEngine:
        with self._lock:
            engine = self._engines.get(pair_digest)
            if engine is None:
                engine = self._engines[pair_digest] = self._load(backend, pair_digest)
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


def engine_cache(app: FastAPI) -> EngineCache:
    """The app's engine cache (made on first use: an API that never serves loads no torch)."""
    with _CACHE_LOCK:
        cache = getattr(app.state, "engines", None)
        if cache is None:
            cache = app.state.engines = EngineCache(app.state.settings.cache_dir / "verified")
        return cache
