"""The speculative decoding loop (batch size 1) and plain greedy decoding.

Invariant of the loop: the target's KV cache holds every token except the newest one
(the *pending* token). Each step feeds ``[pending] + drafts`` to the target in one
forward pass, which yields the target's distribution at every draft position plus one
bonus position; accepted drafts stay in the cache and the rest are cropped away.
The prompt prefill is itself a target call that emits the first token, so plain
decoding has tau = 1 exactly.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from registry.methods import TYPICAL_DELTA, TYPICAL_EPSILON
from runner.drafters import Drafter
from runner.models import CachedLM
from runner.sampling import probs_from_logits, speculative_verify, typical_accept


@dataclass
class PromptRun:
    """Raw per-prompt counters; every derived statistic is computed from these."""

    output_ids: list[int] = field(default_factory=list)
    target_calls: int = 0
    prefill_calls: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    verified_per_position: list[int] = field(default_factory=list)
    emitted: int = 0
    beta_sum: float = 0.0
    beta_count: int = 0
    draft_time_s: float = 0.0
    target_time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DecodeOptions:
    """What the loop needs from :class:`runner.settings.MeasureSettings`."""

    k: int
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    acceptance: str = "strict"
    typical_epsilon: float = TYPICAL_EPSILON
    typical_delta: float = TYPICAL_DELTA
    strict_prefix_tokens: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class SpeculativeEngine:
    """One target (plus optional drafter) reused across prompts."""

    def __init__(
        self,
        target_model,
        drafter: Drafter | None,
        options: DecodeOptions,
        eos: set[int],
        generator: torch.Generator | None = None,
    ) -> None:
        if options.acceptance not in ("strict", "typical"):
            raise ValueError(f"unknown acceptance rule {options.acceptance!r}")
        self.options = options
        self.drafter = drafter
        self.eos = eos
        self.generator = generator
        self.target = CachedLM(target_model, want_hidden=bool(drafter and drafter.needs_hidden))
        self.device = self.target.device
        self._sync = self.device.type == "cuda"

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        o = self.options
        return probs_from_logits(logits, o.temperature, o.top_k, o.top_p)

    def _now(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int | None = None) -> PromptRun:
        """Decode one prompt; ``max_new_tokens`` overrides the options' budget (serving)."""
        o = self.options
        if max_new_tokens is not None:
            o = dataclasses.replace(o, max_new_tokens=max_new_tokens)
        k = o.k if self.drafter is not None else 0
        run = PromptRun(accepted_per_position=[0] * k, verified_per_position=[0] * k)
        if not prompt_ids:
            raise ValueError("empty prompt: encode at least one token (e.g. BOS)")
        if o.max_new_tokens <= 0:
            return run
        self.target.reset()
        if self.drafter is not None:
            self.drafter.start(prompt_ids)
        tokens = list(prompt_ids)
        out: list[int] = []

        # prefill: one target call that emits the first token
        t0 = self._now()
        logits, hidden = self.target.forward(
            torch.tensor(tokens, device=self.device), last_only=not self.target.want_hidden
        )
        first = self._pick(logits[-1:])
        last_hidden = hidden[-1] if hidden is not None else None
        run.target_time_s += self._now() - t0
        run.target_calls += 1
        run.prefill_calls += 1
        out.append(first)
        tokens.append(first)
        done = first in self.eos

        while not done and len(out) < o.max_new_tokens:
            budget = o.max_new_tokens - len(out)
            k_eff = min(k, budget - 1)
            drafts: list[int] = []
            q = None
            if self.drafter is not None and k_eff > 0:
                t0 = self._now()
                drafts, q = self.drafter.propose(tokens, k_eff, last_hidden)
                run.draft_time_s += self._now() - t0
            n = len(drafts)

            t0 = self._now()
            inp = torch.tensor([tokens[-1], *drafts], device=self.device)
            logits, hidden = self.target.forward(inp)
            n_acc, nxt, betas = self._verify(logits, drafts, q, len(out))
            if n_acc < n:
                self.target.rollback(n - n_acc)
            if hidden is not None:
                last_hidden = hidden[n_acc]
            run.target_time_s += self._now() - t0

            run.target_calls += 1
            if n:
                run.steps += 1
                run.drafted += n
                run.accepted += n_acc
                if n_acc < n:
                    run.rejections += 1
                for i in range(min(n_acc + 1, n)):
                    run.verified_per_position[i] += 1
                for i in range(n_acc):
                    run.accepted_per_position[i] += 1
                run.beta_sum += sum(betas)
                run.beta_count += len(betas)
            new = [*drafts[:n_acc], nxt]
            for t in new:
                out.append(t)
                tokens.append(t)
                if t in self.eos:
                    done = True
                    break
            if self.drafter is not None and n:
                self.drafter.commit(tokens)

        run.output_ids = out
        run.emitted = len(out)
        return run

    # ------------------------------------------------------------------ verification

    def _pick(self, logits: torch.Tensor) -> int:
        """A plain target step's token: argmax (greedy) or a draw from processed p."""
        if self.options.greedy:
            return int(logits[0].argmax())
        p = self._probs(logits)
        return int(torch.multinomial(p, 1, generator=self.generator)[0, 0])

    def _verify(
        self, logits: torch.Tensor, drafts: list[int], q: torch.Tensor | None, produced: int
    ) -> tuple[int, int, list[float]]:
        """Return ``(accepted, next_token, betas)`` for one verification pass."""
        o = self.options
        n = len(drafts)
        lossy = o.acceptance == "typical"
        # positions whose output index is below strict_prefix_tokens are verified strictly
        n_strict = n if not lossy else max(0, min(n, o.strict_prefix_tokens - produced))
        if o.greedy and not lossy:
            target_ids = logits.argmax(dim=-1).tolist()
            n_acc = 0
            while n_acc < n and drafts[n_acc] == target_ids[n_acc]:
                n_acc += 1
            return n_acc, target_ids[n_acc], []
        d = torch.tensor(drafts, device=logits.device, dtype=torch.long)
        if o.greedy:
            # typical acceptance under greedy: threshold on T=1 probabilities
            p = torch.softmax(logits.float(), dim=-1)
            target_ids = logits.argmax(dim=-1).tolist()
            ok = typical_accept(p[:n], d, o.typical_epsilon, o.typical_delta).tolist()
            n_acc = 0
            while n_acc < n:
                strict = n_acc < n_strict
                good = drafts[n_acc] == target_ids[n_acc] if strict else ok[n_acc]
                if not good:
                    break
                n_acc += 1
            return n_acc, target_ids[n_acc], []
        p = self._probs(logits)
        if q is None:  # deterministic proposal (prompt lookup): q is a point mass
            q = torch.zeros(n, p.shape[-1], device=p.device, dtype=p.dtype)
            if n:
                q[torch.arange(n, device=p.device), d] = 1.0
        if not lossy:
            return speculative_verify(p, q, d, self.generator)
        # lossy mix: strict rejection sampling for the first n_strict, typical afterwards
        n_acc, nxt, betas = speculative_verify(
            p[: n_strict + 1], q[:n_strict], d[:n_strict], self.generator
        )
        if n_acc < n_strict:
            return n_acc, nxt, betas
        ok = typical_accept(p[:n], d, o.typical_epsilon, o.typical_delta).tolist()
        i = n_strict
        while i < n and ok[i]:
            i += 1
        if i < n:
            betas = betas + torch.minimum(p[n_strict : i + 1], q[n_strict : i + 1]).sum(-1).tolist()
        else:
            betas = betas + torch.minimum(p[n_strict:n], q[n_strict:n]).sum(-1).tolist()
        nxt = int(torch.multinomial(p[i : i + 1], 1, generator=self.generator)[0, 0])
        return i, nxt, betas


@torch.inference_mode()
def greedy_decode(model, prompt_ids: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    """Plain greedy decoding with a KV cache, one token per forward pass."""
    lm = CachedLM(model)
    out: list[int] = []
    inp = torch.tensor(prompt_ids, device=lm.device)
    while len(out) < max_new_tokens:
        logits, _ = lm.forward(inp, last_only=True)
        nxt = int(logits[-1].argmax())
        out.append(nxt)
        if nxt in eos:
            break
        inp = torch.tensor([nxt], device=lm.device)
    return out
