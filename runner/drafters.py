"""Drafters: anything that proposes up to ``k`` next tokens for the target to verify.

Each drafter implements ``start(prompt_ids)``, ``propose(tokens, k, hidden)`` and
``commit(tokens)``. ``propose`` returns the draft token ids and, when the engine samples,
the distributions ``q`` they were drawn from (needed for exact rejection sampling). A
drafter with ``needs_hidden`` gets, as ``hidden``, the target's features (``[m, F]``) at
every position verified since its previous proposal (the last row is the newest); one with
a ``tree`` shape also implements ``propose_tree(tokens, depth, hidden) -> DraftTree``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from runner.models import CachedLM
from runner.tree import DraftTree, StaticTree, build_tree

ProbFn = Callable[[torch.Tensor], torch.Tensor]


class Drafter(Protocol):
    name: str
    needs_hidden: bool

    def start(self, prompt_ids: list[int]) -> None: ...

    def propose(
        self, tokens: list[int], k: int, hidden: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor | None]: ...

    def commit(self, tokens: list[int]) -> None: ...


class DraftModelDrafter:
    """A small causal LM with its own KV cache; proposes ``k`` tokens autoregressively."""

    name = "draft_model"
    needs_hidden = False

    def __init__(
        self,
        model,
        probs: ProbFn | None,
        generator: torch.Generator | None = None,
        vocab: int | None = None,
    ) -> None:
        self.lm = CachedLM(model)
        self.probs = probs  # None = greedy
        self.generator = generator
        self.cached: list[int] = []
        # a draft embedding padded past the target's vocabulary: those ids are never proposed
        self.vocab = vocab

    def start(self, prompt_ids: list[int]) -> None:
        self.lm.reset()
        self.cached = []

    def propose(
        self, tokens: list[int], k: int, hidden: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor | None]:
        if k <= 0:
            return [], None
        new = tokens[len(self.cached) :]
        inp = torch.tensor(new, dtype=torch.long, device=self.lm.device)
        self.cached = list(tokens)
        out: list[torch.Tensor] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            logits, _ = self.lm.forward(inp, last_only=True)
            last = logits[-1] if self.vocab is None else logits[-1][: self.vocab]
            if self.probs is None:
                nxt = last.argmax()
            else:
                q = self.probs(last)
                nxt = torch.multinomial(q, 1, generator=self.generator)[0]
                qs.append(q)
            out.append(nxt)
            if i < k - 1:
                inp = nxt.view(1)
        drafts = torch.stack(out).tolist()
        self.cached.extend(drafts[:-1])  # the last draft was never fed
        return drafts, (torch.stack(qs) if qs else None)

    def commit(self, tokens: list[int]) -> None:
        """Keep only the cache entries still on the accepted path."""
        keep = 0
        limit = min(len(self.cached), len(tokens))
        # the prefix before this step's drafts is shared by construction; scan the rest
        keep = limit
        for i in range(limit):
            if self.cached[i] != tokens[i]:
                keep = i
                break
        drop = len(self.cached) - keep
        if drop > 0:
            self.lm.rollback(drop)
            del self.cached[keep:]


class PromptLookupDrafter:
    """N-gram copy from the prompt and the output so far (no model).

    For ``n`` from ``max_ngram`` down to 1, match the last ``n`` tokens against the
    earlier sequence and take the **first** (earliest) occurrence that has a continuation,
    as transformers' prompt lookup does; propose the next ``k`` tokens after it. With no
    match it proposes nothing and the engine takes a plain target step.
    """

    name = "prompt_lookup"
    needs_hidden = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if max_ngram < 1 or min_ngram < 1 or min_ngram > max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.device = torch.device("cpu")

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(
        self, tokens: list[int], k: int, hidden: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor | None]:
        if k <= 0:
            return [], None
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = tokens[length - n :]
            first = suffix[0]
            # candidate starts: occurrences whose continuation is non-empty
            for i in range(0, length - n):
                if tokens[i] == first and tokens[i : i + n] == suffix:
                    return tokens[i + n : i + n + k], None
        return [], None

    def commit(self, tokens: list[int]) -> None:
        pass


class MedusaDrafter:
    """Medusa heads on the target's last hidden state: a chain of top-1 (greedy) or
    sampled candidates, one per head (so ``k`` is capped at the number of heads), or a
    static token tree (``tree``: candidate ranks per head, Medusa-2 style)."""

    name = "medusa"
    needs_hidden = True

    def __init__(
        self,
        heads,
        probs: ProbFn | None,
        generator: torch.Generator | None,
        tree: StaticTree | None = None,
    ) -> None:
        self.heads = heads
        self.probs = probs
        self.generator = generator
        self.tree = tree

    @property
    def num_heads(self) -> int:
        return self.heads.num_heads

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def propose(
        self, tokens: list[int], k: int, hidden: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor | None]:
        k = min(k, self.heads.num_heads)
        if k <= 0 or hidden is None:
            return [], None
        last = hidden[-1]
        logits = torch.stack([self.heads.heads[i](last) for i in range(k)]).float()
        if self.probs is None:
            return logits.argmax(dim=-1).tolist(), None
        q = self.probs(logits)
        drafts = torch.multinomial(q, 1, generator=self.generator).squeeze(-1)
        return drafts.tolist(), q

    def propose_tree(self, tokens: list[int], depth: int, hidden: torch.Tensor | None) -> DraftTree:
        """Every head reads the same hidden state, so the candidates at depth ``d`` come
        from head ``d - 1`` whatever the path above them."""
        depth = min(depth, self.heads.num_heads)
        if depth <= 0 or hidden is None or self.tree is None:
            return DraftTree()
        last = hidden[-1]
        per_depth = [self.heads.heads[i](last).float() for i in range(depth)]

        def expand(tree: DraftTree, nodes: list[int]) -> torch.Tensor:
            return torch.stack([per_depth[tree.depths[n]] for n in nodes])

        return build_tree(self.tree, per_depth[0], expand, depth, self.probs, self.generator)

    def commit(self, tokens: list[int]) -> None:
        pass
