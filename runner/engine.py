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
from collections.abc import Generator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from registry.methods import TYPICAL_DELTA, TYPICAL_EPSILON
from runner.drafters import Drafter
from runner.models import CachedLM, tree_mask
from runner.sampling import probs_from_logits, speculative_verify, typical_accept
from runner.timings import StepTimings
from runner.tree import DraftTree, verify_greedy, verify_sampling


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

    def vllm_counters(self) -> dict[str, Any]:
        """This prompt's counters under vLLM's names (``spec_decode_num_drafts`` …)."""
        return {
            "num_drafts": self.steps,
            "num_draft_tokens": self.drafted,
            "num_accepted_tokens": self.accepted,
            "num_accepted_tokens_per_pos": list(self.accepted_per_position),
        }


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
    # vLLM's counting: a full k drafted on the last steps (see MeasureSettings)
    full_last_draft: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class SpeculativeEngine:
    """One target (plus optional drafter) reused across prompts.

    A drafter with a ``tree`` shape proposes a token tree each step, verified in one target
    pass with a tree attention mask (:mod:`runner.tree`); otherwise a chain. Tree
    verification is lossless only under the strict rule, so a lossy rule refuses trees.
    """

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
        self.tree_mode = getattr(drafter, "tree", None) is not None
        if self.tree_mode and options.acceptance != "strict":
            raise ValueError("token trees are verified with the strict rule only")
        self.target = CachedLM(
            target_model,
            want_hidden=bool(drafter and drafter.needs_hidden),
            aux_layers=getattr(drafter, "aux_layers", None),
        )
        self.device = self.target.device
        self._sync = self.device.type == "cuda"
        # per-pass costs for pair economics (tokens verified per pass -> time)
        self.timings = StepTimings()

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        o = self.options
        return probs_from_logits(logits, o.temperature, o.top_k, o.top_p)

    def _now(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _target_forward(
        self,
        run: PromptRun,
        ids: list[int],
        last_only: bool = False,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        prefill: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every target pass goes through here (one place to time or count them)."""
        t0 = self._now()
        out = self.target.forward(
            torch.tensor(ids, device=self.device), last_only=last_only, positions=positions,
            mask=mask,
        )  # fmt: skip
        dt = self._now() - t0
        run.target_time_s += dt
        self.timings.add_target(len(ids), dt, prefill=prefill)
        run.target_calls += 1
        return out

    def generate(self, prompt_ids: list[int], max_new_tokens: int | None = None) -> PromptRun:
        """Decode one prompt; ``max_new_tokens`` overrides the options' budget (serving)."""
        steps = self.stream(prompt_ids, max_new_tokens)
        while True:
            try:
                next(steps)
            except StopIteration as end:
                return end.value  # type: ignore[no-any-return]

    @torch.inference_mode()
    def stream(
        self, prompt_ids: list[int], max_new_tokens: int | None = None
    ) -> Generator[list[int], None, PromptRun]:
        """Decode one prompt, yielding each step's accepted tokens the moment they are
        verified (the prefill's first token, then each draft-and-verify step's accepted
        drafts plus its bonus token, cut at the budget and at end of sequence); the
        generator's return value is the prompt's :class:`PromptRun`. Serving streams from
        here; :meth:`generate` just drains it, so both decode exactly alike."""
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
        # target features at positions the drafter has not been shown yet
        feats: list[torch.Tensor] = []

        # prefill: one target call that emits the first token
        logits, hidden = self._target_forward(
            run, tokens, last_only=not self.target.want_hidden, prefill=True
        )
        first = self._pick(logits[-1:])
        if hidden is not None:
            feats.append(hidden)
        run.prefill_calls += 1
        out.append(first)
        tokens.append(first)
        done = first in self.eos
        yield [first]
        t_decode = self._now()

        while not done and len(out) < o.max_new_tokens:
            budget = o.max_new_tokens - len(out)
            # trimmed, the last draft never runs past the budget; in full, the step drafts
            # and verifies k anyway and only the budget's tokens are emitted (vLLM)
            k_eff = k if o.full_last_draft else min(k, budget - 1)
            new_hidden = torch.cat(feats) if feats else None
            if self.tree_mode:
                new, kept_hidden = self._tree_step(run, tokens, k_eff, new_hidden)
            else:
                new, kept_hidden = self._chain_step(run, tokens, k_eff, new_hidden, len(out))
            if kept_hidden is not None:
                # a drafter that proposed has seen every earlier feature row
                feats = [kept_hidden] if k_eff > 0 else [*feats, kept_hidden]
            kept: list[int] = []
            for t in new[:budget]:
                kept.append(t)
                if t in self.eos:
                    done = True
                    break
            out.extend(kept)
            tokens.extend(kept)
            yield kept

        self.timings.add_decode(self._now() - t_decode, len(out) - 1)
        run.output_ids = out
        run.emitted = len(out)
        return run

    def _chain_step(
        self,
        run: PromptRun,
        tokens: list[int],
        k_eff: int,
        new_hidden: torch.Tensor | None,
        produced: int,
    ) -> tuple[list[int], torch.Tensor | None]:
        """Draft a chain, verify it in one pass; return the new tokens and the target
        features of the positions it verified for good."""
        drafts: list[int] = []
        q = None
        if self.drafter is not None and k_eff > 0:
            t0 = self._now()
            drafts, q = self.drafter.propose(tokens, k_eff, new_hidden)
            dt = self._now() - t0
            run.draft_time_s += dt
            self.timings.add_draft(k_eff, dt)
        n = len(drafts)
        logits, hidden = self._target_forward(run, [tokens[-1], *drafts])
        n_acc, nxt, betas = self._verify(logits, drafts, q, produced)
        if n_acc < n:
            self.target.rollback(n - n_acc)
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
        if self.drafter is not None and n:
            self.drafter.commit([*tokens, *drafts[:n_acc], nxt])
        return [*drafts[:n_acc], nxt], (None if hidden is None else hidden[: n_acc + 1])

    def _tree_step(
        self, run: PromptRun, tokens: list[int], depth: int, new_hidden: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """Draft a token tree, verify it in one pass, keep only the accepted path."""
        assert self.drafter is not None
        tree = DraftTree()
        if depth > 0:
            t0 = self._now()
            tree = self.drafter.propose_tree(tokens, depth, new_hidden)  # type: ignore[attr-defined]
            dt = self._now() - t0
            run.draft_time_s += dt
            self.timings.add_draft(depth, dt)
        n = len(tree)
        past = self.target.length
        if n:
            positions = past + torch.tensor([0, *tree.depths])
            mask = tree_mask(past, tree.input_parents(), self._mask_dtype(), self.device)
            logits, hidden = self._target_forward(
                run, [tokens[-1], *tree.tokens], positions=positions, mask=mask
            )
        else:
            logits, hidden = self._target_forward(run, [tokens[-1]])
        if self.options.greedy:
            verdict = verify_greedy(logits.argmax(dim=-1).tolist(), tree)
        else:
            verdict = verify_sampling(self._probs(logits), tree, self.generator)
        rows = [0] + [node + 1 for node in verdict.path]
        self.target.keep_tail(past, rows)
        n_acc = len(verdict.path)
        if n:
            run.steps += 1
            run.drafted += n
            run.accepted += n_acc
            if verdict.rejected:
                run.rejections += 1
            for i in range(n_acc + (1 if verdict.rejected else 0)):
                run.verified_per_position[i] += 1
            for i in range(n_acc):
                run.accepted_per_position[i] += 1
        new = [tree.tokens[node] for node in verdict.path] + [verdict.next_token]
        return new, (None if hidden is None else hidden[rows])

    def _mask_dtype(self) -> torch.dtype:
        return next(self.target.model.parameters()).dtype

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
