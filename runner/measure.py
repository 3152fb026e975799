"""``measure_pair``: run a pair over prompts and return raw counters plus statistics."""

from __future__ import annotations

import os
import platform
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from runner.build import build_engine
from runner.engine import SpeculativeEngine, greedy_decode
from runner.models import eos_ids, load_causal_lm, load_tokenizer, resolve_device
from runner.render import check_renderable, encode_prompt, rendering_record
from runner.settings import MeasureSettings
from runner.stats import summarize
from runner.suites import Prompt
from runner.timings import economics_summary
from runner.version import RUNNER_VERSION


@dataclass
class MeasurementResult:
    """Everything one measurement produced; ``to_dict`` is the stored/JSON shape."""

    settings: dict[str, Any]
    lossy: bool
    categories: dict[str, dict[str, Any]]
    overall: dict[str, Any]
    prompts: list[dict[str, Any]]
    hardware: dict[str, Any]
    runner_version: str = RUNNER_VERSION
    suite_digest: str | None = None
    rendering: dict[str, Any] | None = None
    target_dir: str | None = None
    drafter_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    economics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "settings": self.settings,
            "lossy": self.lossy,
            "categories": self.categories,
            "overall": self.overall,
            "prompts": self.prompts,
            "hardware": self.hardware,
            "runner_version": self.runner_version,
        }
        if self.suite_digest is not None:
            d["suite_digest"] = self.suite_digest
        if self.rendering is not None:
            d["rendering"] = self.rendering
        if self.target_dir is not None:
            d["target_dir"] = self.target_dir
        if self.drafter_dir is not None:
            d["drafter_dir"] = self.drafter_dir
        if self.extra:
            d["extra"] = self.extra
        if self.economics:
            d["economics"] = self.economics
        return d


def hardware_info(device: torch.device) -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "device": device.type,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def _prompt_seed(seed: int, prompt_id: str) -> int:
    """Seed per prompt from its id, so results do not depend on prompt order."""
    return (seed * 1_000_003 + zlib.crc32(prompt_id.encode("utf-8"))) % (2**63)


def measure_pair(
    target_dir: str,
    drafter_dir: str | None,
    prompts: Sequence[Prompt],
    settings: MeasureSettings,
    progress: Callable[[int, int], None] | None = None,
    suite_digest: str | None = None,
    plain_baseline: bool = True,
) -> MeasurementResult:
    """Run every prompt through the speculative loop and summarise.

    ``drafter_dir`` is a causal LM (``draft_model``), Medusa heads (``medusa``), an EAGLE
    head in the speculators format (``eagle``, ``eagle3``) or ignored (``prompt_lookup``,
    ``none``); ``settings.tree`` turns a head's chain into a token tree of depth ``k``.
    ``progress(done, total)`` after each prompt.

    With ``plain_baseline`` the same prompts are decoded again by the target alone, so the
    result's ``economics`` holds the measured speed-up against plain decoding, the target's
    pass time by tokens verified, the drafter's step time, and the batch-1 prediction from
    those timings (:mod:`runner.timings`).
    """
    s = settings
    check_renderable(load_tokenizer(target_dir, s.trust_remote_code), prompts)  # no weights yet
    built = build_engine(s, target_dir, drafter_dir)
    engine, tokenizer, generator, k = built.engine, built.tokenizer, built.generator, built.k
    rows: list[dict[str, Any]] = []
    total = len(prompts)
    engine.timings.reset()
    # plain decoding of each prompt right after its speculative run: machine load then
    # weighs on both sides of the measured speed-up alike
    plain = None
    if plain_baseline and engine.drafter is not None:
        plain = SpeculativeEngine(built.target, None, engine.options, built.eos, generator)
    for i, p in enumerate(prompts):
        generator.manual_seed(_prompt_seed(s.seed, p.id))
        try:
            ids = encode_prompt(tokenizer, p)
        except ValueError as exc:
            raise ValueError(f"prompt {p.id}: {exc}") from exc
        run = engine.generate(ids)
        row = {"id": p.id, "category": p.category, **run.to_dict()}
        rows.append(row)
        if plain is not None:
            generator.manual_seed(_prompt_seed(s.seed, p.id))
            plain.generate(ids)
        if progress is not None:
            progress(i + 1, total)
    stats = summarize(rows, k)
    economics = economics_summary(
        engine.timings, plain.timings if plain else None, tau=stats["overall"]["tau"]
    )
    settings_dict = s.to_dict()
    settings_dict["k_effective"] = k
    return MeasurementResult(
        settings=settings_dict,
        lossy=s.lossy,
        categories=stats["categories"],
        overall=stats["overall"],
        prompts=rows,
        hardware=hardware_info(built.device),
        suite_digest=suite_digest,
        rendering=rendering_record(tokenizer, prompts),
        target_dir=str(target_dir),
        drafter_dir=str(drafter_dir) if drafter_dir else None,
        economics=economics,
    )


def plain_greedy(
    target_dir: str | Any, prompt_ids: list[int], max_new_tokens: int, device: str = "cpu"
) -> list[int]:
    """Reference greedy decoding (one token per forward pass) for correctness checks.
    Accepts a directory or an already loaded model."""
    if isinstance(target_dir, str | os.PathLike):
        tokenizer = load_tokenizer(target_dir)
        model = load_causal_lm(target_dir, resolve_device(device))
    else:
        model, tokenizer = target_dir, None
    return greedy_decode(model, list(prompt_ids), max_new_tokens, eos_ids(model, tokenizer))
