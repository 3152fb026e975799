"""The EAGLE drafter: an :class:`runner.eagle.EagleHead` run beside the target, proposing a
chain or a token tree (EAGLE-2 dynamic, or a static tree) each step.

The head keeps its own KV cache. *Real* entries hold the pairs ``(t_{i+1}, f_i)`` for every
position the target has verified (``f_i`` = the target's features there); tree and chain
drafting append *speculative* entries after them, which are cropped away at the next step,
when the accepted tokens' real features arrive. The engine hands over, at each proposal,
the target features of every position verified since the previous one.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from runner.eagle import EagleHead
from runner.models import tree_mask
from runner.tree import AcceptanceProfile, DraftTree, ProbFn, TreeShape, build_tree


class EagleDrafter:
    """EAGLE-1 / EAGLE-3 drafting; ``tree=None`` drafts a chain of ``k`` tokens."""

    needs_hidden = True

    def __init__(
        self,
        head: EagleHead,
        target_model,
        probs: ProbFn | None,
        generator: torch.Generator | None,
        tree: TreeShape | None = None,
    ) -> None:
        self.head = head.attach(target_model)
        self.name = "eagle" if head.spec.version == 1 else "eagle3"
        self.aux_layers = (
            head.aux_layers(int(target_model.config.num_hidden_layers))
            if head.spec.version == 3
            else None
        )
        self.probs = probs
        self.generator = generator
        self.tree = tree
        p = next(head.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache = DynamicCache()
        self.n_real = 0
        self._root_hidden: torch.Tensor | None = None
        self._hidden: dict[int, torch.Tensor] = {}  # node -> its output hidden state
        self._slot: dict[int, int] = {}  # node -> its speculative cache entry
        # sampled trees are planned from how past trees fared (kept across prompts)
        self.profile = AcceptanceProfile()
        self._last_tree: DraftTree | None = None
        self._last_len = 0

    def start(self, prompt_ids: list[int]) -> None:
        self.cache = DynamicCache()
        self.n_real = 0
        self._last_tree = None

    def commit(self, tokens: list[int]) -> None:
        pass

    # ------------------------------------------------------------------ cache

    def _cached(self) -> int:
        return self.cache.get_seq_length()

    def _run(
        self,
        ids: list[int],
        hidden: torch.Tensor,
        positions: list[int],
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.device
        out, logits = self.head(
            torch.tensor([ids], device=dev),
            hidden.unsqueeze(0),
            torch.tensor([positions], device=dev),
            mask,
            self.cache,
        )
        return out[0], logits[0].float()

    def _ingest(self, tokens: list[int], feats: torch.Tensor | None) -> torch.Tensor:
        """Drop last step's speculative entries, add the real pairs for the newly
        verified positions, and return the draft logits for the first candidate."""
        spec = self._cached() - self.n_real
        if spec > 0:
            self.cache.crop(-spec)
        m = len(tokens) - 1 - self.n_real
        if feats is None or feats.shape[0] != m:
            got = None if feats is None else feats.shape[0]
            raise RuntimeError(f"EAGLE drafter expected features for {m} positions, got {got}")
        start = self.n_real
        mask = tree_mask(start, list(range(-1, m - 1)), self.dtype, self.device)
        out, logits = self._run(
            tokens[start + 1 :],
            self.head.fuse(feats.to(self.dtype)),
            list(range(start, start + m)),
            mask,
        )
        self.n_real += m
        self._root_hidden = out[-1]
        self._hidden = {}
        self._slot = {}
        return logits[-1]

    def _expand(self, tree: DraftTree, nodes: list[int]) -> torch.Tensor:
        """Run the head on ``nodes`` (one depth): each is the pair (its token, its
        parent's output) at position ``n_real - 1 + depth``, attending to the real prefix,
        its ancestors' entries and itself."""
        past = self._cached()
        n = len(nodes)
        allowed = torch.zeros(n, past + n, dtype=torch.bool)
        allowed[:, : self.n_real] = True
        hidden = []
        for j, node in enumerate(nodes):
            allowed[j, past + j] = True
            a = tree.parents[node]
            while a >= 0:
                allowed[j, self._slot[a]] = True
                a = tree.parents[a]
            parent = tree.parents[node]
            hidden.append(self._root_hidden if parent < 0 else self._hidden[parent])
        mask = torch.zeros(n, past + n, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        out, logits = self._run(
            [tree.tokens[u] for u in nodes],
            torch.stack(hidden),  # type: ignore[arg-type]
            [self.n_real - 1 + tree.depths[u] for u in nodes],
            mask.to(self.device).view(1, 1, n, past + n),
        )
        for j, node in enumerate(nodes):
            self._slot[node] = past + j
            self._hidden[node] = out[j]
        return logits

    # ------------------------------------------------------------------ proposals

    def propose_tree(self, tokens: list[int], depth: int, hidden: torch.Tensor | None) -> DraftTree:
        root = self._ingest(tokens, hidden)
        assert self.tree is not None
        if self._last_tree is not None and self.probs is not None:
            self.profile.observe(self._last_tree, tokens[self._last_len :])
        tree = build_tree(
            self.tree, root, self._expand, depth, self.probs, self.generator, self.profile
        )
        self._last_tree, self._last_len = tree, len(tokens)
        return tree

    def propose(
        self, tokens: list[int], k: int, hidden: torch.Tensor | None
    ) -> tuple[list[int], torch.Tensor | None]:
        logits = self._ingest(tokens, hidden)
        if k <= 0:
            return [], None
        chain = DraftTree()
        qs: list[torch.Tensor] = []
        for s in range(k):
            if self.probs is None:
                tok = int(logits.argmax())
            else:
                q = self.probs(logits)
                tok = int(torch.multinomial(q, 1, generator=self.generator)[0])
                qs.append(q)
            parent = len(chain.tokens) - 1
            chain.tokens.append(tok)
            chain.parents.append(parent)
            chain.depths.append(s + 1)
            if s < k - 1:
                logits = self._expand(chain, [s])[0]
        return chain.tokens, (torch.stack(qs) if qs else None)
