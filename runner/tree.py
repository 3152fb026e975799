"""Token trees: building a tree of draft candidates and verifying it losslessly.

A tree hangs below the *pending* token (the newest token, not yet in the target's cache;
call it the root). Node ``i`` carries a token, its parent (``-1`` for the root) and its
depth (1 for the root's children). The target sees ``[pending, *tree.tokens]`` in one pass
with a tree attention mask, so row 0 of its output is the distribution after the pending
token and row ``i + 1`` the distribution after node ``i``'s path.

Verification walks down from the root:

* **greedy**: take the target's argmax at the current node; if a child carries that token,
  accept it and continue there, otherwise stop and emit the argmax. The accepted path is
  the longest one the target agrees with, and the output equals plain greedy decoding.
* **sampling** (SpecInfer's recursive rejection sampling over siblings): at the current
  node with target distribution ``p`` and children drawn i.i.d. from the drafter's ``q``,
  try the draws in order: accept draw ``x`` with probability ``min(1, p(x) / q(x))``; after
  each rejection replace ``p`` by ``norm(max(0, p - q))`` and try the next draw; when every
  draw is rejected, sample the emitted token from the final residual. Each round is one
  ordinary speculative-sampling step against the current residual, whose output is
  distributed exactly as that residual, so by induction the emitted token follows the
  target's ``p`` exactly; once a child is accepted the same argument restarts below it.

Why sibling candidates must be *sampled* when sampling: the ``min(1, p/q)`` rule is exact
only for a candidate that really was drawn from ``q``. The top-k tokens of ``q`` were not:
checking them with this rule over-accepts the draft's favourite tokens (a rejected test,
``tests/runner/test_tree_sampling.py``, shows the skew). Top-k candidates would need the
point-mass rule instead (accept ``x`` with probability ``p(x)``, then remove ``x`` from
``p``), which accepts less whenever ``q`` is close to ``p``. So under sampling every child
list here is a sequence of i.i.d. draws from the recorded ``q``; a repeated draw keeps its
place in the list (its rejection still updates the residual) but shares the first copy's
node, since after the first copy's rejection ``p(x) = 0`` and it is rejected for sure.

The tree's *shape* may depend on anything decided before a node's children are drawn
(which nodes to expand, how many draws each gets), never on the drawn values themselves:
dropping a drawn sibling because of its own value would bias which candidates the target
sees. Under greedy decoding any tree is exact, so EAGLE-2's rerank (keep the best
``total_tokens`` nodes by cumulative draft confidence) is used there as published; under
sampling the budget is spread over depths before each layer is drawn, and nothing drawn is
dropped.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

ProbFn = Callable[[torch.Tensor], torch.Tensor]
# expand(tree, node ids at one depth) -> draft logits (target vocabulary), one row per node
ExpandFn = Callable[["DraftTree", list[int]], torch.Tensor]


@dataclass
class DraftTree:
    """Candidates below the pending token; parents always precede their children."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    # parent (-1 = root) -> child node ids in draw order; a repeated draw repeats its node
    draws: dict[int, list[int]] = field(default_factory=dict)
    # parent -> the draft distribution its children were drawn from (sampling only)
    q: dict[int, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def child_with_token(self, parent: int, token: int) -> int | None:
        for c in self.draws.get(parent, ()):
            if self.tokens[c] == token:
                return c
        return None

    def input_parents(self) -> list[int]:
        """Parents of ``[pending, *tokens]`` as row indices (row 0 is the pending token)."""
        return [-1] + [p + 1 for p in self.parents]

    def subtree(self, keep: Sequence[int]) -> DraftTree:
        """The tree restricted to ``keep`` (ancestor-closed), renumbered in order."""
        keep = sorted(keep)
        new_id = {old: i for i, old in enumerate(keep)}
        new_id[-1] = -1
        out = DraftTree()
        for old in keep:
            out.tokens.append(self.tokens[old])
            out.parents.append(new_id[self.parents[old]])
            out.depths.append(self.depths[old])
        for parent, kids in self.draws.items():
            if parent != -1 and parent not in new_id:
                continue
            kept = [new_id[c] for c in kids if c in new_id]
            if kept:
                out.draws[new_id[parent]] = kept
        for parent, dist in self.q.items():
            if parent in new_id:
                out.q[new_id[parent]] = dist
        return out


# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class StaticTree:
    """Medusa/EAGLE-1 style fixed tree: each choice is a path of candidate ranks, e.g.
    ``(0, 1)`` = the second candidate below the first candidate. Prefix-closed."""

    choices: tuple[tuple[int, ...], ...]

    @property
    def depth(self) -> int:
        return max((len(c) for c in self.choices), default=0)

    def children(self, path: tuple[int, ...]) -> list[tuple[int, ...]]:
        n = len(path) + 1
        return sorted(c for c in self.choices if len(c) == n and c[:-1] == path)


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2: expand the ``top_k`` most confident nodes of each layer with ``top_k``
    candidates each, then verify the best ``total_tokens`` nodes."""

    top_k: int
    total_tokens: int


TreeShape = StaticTree | DynamicTree


def tree_shape(config: dict[str, Any] | None) -> TreeShape | None:
    """A pair config's ``tree`` value (normalised by the registry) as a shape."""
    if not config:
        return None
    kind = config.get("kind") or ("static" if "choices" in config else "dynamic")
    if kind == "static":
        choices = tuple(tuple(int(x) for x in c) for c in config["choices"])
        return StaticTree(choices)
    if kind == "dynamic":
        return DynamicTree(int(config["top_k"]), int(config["total_tokens"]))
    raise ValueError(f"unknown tree kind {kind!r}")


# --------------------------------------------------------------------------- building


class TreeBuilder:
    """Grows a :class:`DraftTree` layer by layer from draft logits."""

    def __init__(self, probs: ProbFn | None, generator: torch.Generator | None) -> None:
        self.probs = probs  # None = greedy
        self.generator = generator
        self.tree = DraftTree()
        self.scores: list[float] = []  # cumulative log-confidence per node

    @property
    def greedy(self) -> bool:
        return self.probs is None

    def score(self, node: int) -> float:
        return 0.0 if node < 0 else self.scores[node]

    def add_children(
        self,
        parent: int,
        logits: torch.Tensor,
        n: int,
        ranks: set[int] | None = None,
        q_ready: bool = False,
    ) -> list[int | None]:
        """Add up to ``n`` children below ``parent``: the top ``n`` distinct tokens
        (greedy; only those whose rank is in ``ranks`` when given, ``None`` for the others)
        or ``n`` i.i.d. draws (sampling; ``None`` marks a repeated draw; with ``q_ready``
        ``logits`` already holds the processed draft distribution)."""
        t = self.tree
        depth = 1 if parent < 0 else t.depths[parent] + 1
        base = self.score(parent)
        out: list[int | None] = []
        if n <= 0:
            return out
        if self.greedy:
            logp = torch.log_softmax(logits.float(), dim=-1)
            n = min(n, int(torch.isfinite(logp).sum()))
            top = torch.topk(logp, n)
            tokens = top.indices.tolist()
            confs = top.values.tolist()
            draws = t.draws.setdefault(parent, [])
            for rank, (tok, conf) in enumerate(zip(tokens, confs, strict=True)):
                if ranks is not None and rank not in ranks:
                    out.append(None)
                    continue
                node = self._new(parent, tok, depth, base + conf)
                draws.append(node)
                out.append(node)
            return out
        q = logits if q_ready else self.probs(logits)  # type: ignore[misc]
        t.q[parent] = q
        drawn = torch.multinomial(q, n, replacement=True, generator=self.generator).tolist()
        draws = t.draws.setdefault(parent, [])
        seen: dict[int, int] = {}
        for tok in drawn:
            if tok in seen:
                draws.append(seen[tok])
                out.append(None)
                continue
            node = self._new(parent, tok, depth, base + math.log(max(float(q[tok]), 1e-30)))
            seen[tok] = node
            draws.append(node)
            out.append(node)
        return out

    def _new(self, parent: int, token: int, depth: int, score: float) -> int:
        t = self.tree
        t.tokens.append(int(token))
        t.parents.append(parent)
        t.depths.append(depth)
        self.scores.append(score)
        return len(t.tokens) - 1


def build_tree(
    shape: TreeShape,
    root_logits: torch.Tensor,
    expand: ExpandFn,
    max_depth: int,
    probs: ProbFn | None,
    generator: torch.Generator | None,
) -> DraftTree:
    """Grow a tree of at most ``max_depth`` levels.

    ``root_logits``: the draft's logits for the first candidate position. ``expand(tree, nodes)``
    returns the draft's logits below each of ``nodes`` (all at one depth), in order; it is
    called once per depth, for the nodes that get children.
    """
    b = TreeBuilder(probs, generator)
    if max_depth <= 0:
        return b.tree
    if isinstance(shape, StaticTree):
        return _build_static(b, shape, root_logits, expand, max_depth)
    return _build_dynamic(b, shape, root_logits, expand, max_depth)


def _build_static(
    b: TreeBuilder,
    shape: StaticTree,
    root_logits: torch.Tensor,
    expand: ExpandFn,
    max_depth: int,
) -> DraftTree:
    """Greedy: slot ``(…, r)`` is the rank-``r`` candidate. Sampling: a node with ``m``
    child slots gets ``m`` draws, and slot ``j`` follows draw ``j`` (a repeated draw's
    slot subtree is skipped: that draw can never be accepted)."""
    path_of: dict[int, tuple[int, ...]] = {-1: ()}
    layer = [-1]
    logits_of = {-1: root_logits}
    for depth in range(1, max_depth + 1):
        nxt: list[int] = []
        for node in layer:
            slots = shape.children(path_of[node])
            if not slots:
                continue
            if b.greedy:
                ranks = {s[-1] for s in slots}
                made = b.add_children(node, logits_of[node], max(ranks) + 1, ranks)
                for r, child in enumerate(made):
                    if child is not None:
                        path_of[child] = (*path_of[node], r)
                        nxt.append(child)
            else:
                made = b.add_children(node, logits_of[node], len(slots))
                for slot, child in zip(slots, made, strict=True):
                    if child is not None:
                        path_of[child] = slot
                        nxt.append(child)
        if depth == max_depth or not nxt:
            break
        to_expand = [n for n in nxt if shape.children(path_of[n])]
        if to_expand:
            for n, lg in zip(to_expand, expand(b.tree, to_expand), strict=True):
                logits_of[n] = lg
        layer = to_expand
    return b.tree


def _build_dynamic(
    b: TreeBuilder,
    shape: DynamicTree,
    root_logits: torch.Tensor,
    expand: ExpandFn,
    max_depth: int,
) -> DraftTree:
    k, budget = shape.top_k, shape.total_tokens
    if b.greedy:
        # EAGLE-2 as published: expand the top-k of each new layer, rerank everything
        layer = [c for c in b.add_children(-1, root_logits, k) if c is not None]
        for _ in range(1, max_depth):
            frontier = sorted(layer, key=lambda n: -b.scores[n])[:k]
            if not frontier:
                break
            layer = []
            for n, lg in zip(frontier, expand(b.tree, frontier), strict=True):
                layer += [c for c in b.add_children(n, lg, k) if c is not None]
        return b.tree.subtree(_best_closed(b, budget))
    # sampling: plan each layer's draws before drawing it; keep everything drawn
    return _build_sampled(b, k, budget, root_logits, expand, max_depth)


# The planning value of a sampled candidate: the chance the walk reaches it, modelled as
# ``value(parent) * A * ((1 - A) * (1 - s))^j`` for the parent's ``j``-th distinct draw, with
# ``A`` an assumed first-draw acceptance and ``s = sum q^2`` the chance a further draw repeats
# an earlier one (a repeat adds nothing). Only the parent's ``q`` enters, never the draws.
ASSUMED_ACCEPTANCE = 0.7


def _slot_values(base: float, q: torch.Tensor, n: int) -> list[float]:
    s = float((q * q).sum())
    decay = max((1 - ASSUMED_ACCEPTANCE) * (1 - s), 1e-9)
    return [base + math.log(ASSUMED_ACCEPTANCE) + j * math.log(decay) for j in range(n)]


def _build_sampled(
    b: TreeBuilder,
    k: int,
    budget: int,
    root_logits: torch.Tensor,
    expand: ExpandFn,
    max_depth: int,
) -> DraftTree:
    """EAGLE-2's budget under sampling: each layer gets an even share of the remaining
    draws, spent on the most valuable slots (see :data:`ASSUMED_ACCEPTANCE`) of the ``k``
    most valuable nodes of the layer above; every draw is verified."""
    used = 0
    parents = [-1]
    logits = [root_logits]
    for depth in range(1, max_depth + 1):
        share = math.ceil((budget - used) / (max_depth - depth + 1))
        if share <= 0 or not parents:
            break
        qs = [b.probs(lg) for lg in logits]  # type: ignore[misc]
        slots = [
            (v, n, q)
            for n, q in zip(parents, qs, strict=True)
            for v in _slot_values(b.score(n), q, k)
        ]
        slots.sort(key=lambda t: -t[0])
        counts: dict[int, int] = {}
        for _, n, _ in slots[:share]:
            counts[n] = counts.get(n, 0) + 1
        layer: list[int] = []
        for n, q in zip(parents, qs, strict=True):
            m = counts.get(n, 0)
            if not m:
                continue
            made = [c for c in b.add_children(n, q, m, q_ready=True) if c is not None]
            for c, v in zip(made, _slot_values(b.score(n), q, len(made)), strict=True):
                b.scores[c] = v
            layer += made
            used += m
        if depth == max_depth:
            break
        parents = sorted(layer, key=lambda c: -b.scores[c])[:k]
        logits = list(expand(b.tree, parents)) if parents else []
    return b.tree


def _best_closed(b: TreeBuilder, budget: int) -> list[int]:
    """The ``budget`` most confident nodes whose ancestors are all kept (a child's score
    never exceeds its parent's, so this is plain top-N up to ties)."""
    heap = [(-b.scores[c], c) for c in b.tree.draws.get(-1, [])]
    heapq.heapify(heap)
    kept: list[int] = []
    while heap and len(kept) < budget:
        _, node = heapq.heappop(heap)
        kept.append(node)
        for c in b.tree.draws.get(node, []):
            heapq.heappush(heap, (-b.scores[c], c))
    return kept


# --------------------------------------------------------------------------- verifying


@dataclass
class TreeVerdict:
    """Outcome of verifying one tree: the accepted nodes (root to leaf), the next token,
    and whether the walk stopped at a rejection (the last accepted node had candidates)."""

    path: list[int]
    next_token: int
    rejected: bool


def verify_greedy(target_ids: Sequence[int], tree: DraftTree) -> TreeVerdict:
    """``target_ids[r]`` = the target's argmax at input row ``r``."""
    node, path = -1, []
    while True:
        want = int(target_ids[node + 1])
        child = tree.child_with_token(node, want)
        if child is None:
            return TreeVerdict(path, want, bool(tree.draws.get(node)))
        path.append(child)
        node = child


def verify_sampling(
    p: torch.Tensor, tree: DraftTree, generator: torch.Generator | None
) -> TreeVerdict:
    """Recursive rejection sampling; ``p[r]`` = processed target probabilities at row
    ``r``. Exact whatever ``q`` was, as long as each child list holds i.i.d. draws from
    ``tree.q[parent]`` (see the module docstring)."""
    node, path = -1, []
    while True:
        residual = p[node + 1]
        draws = tree.draws.get(node, [])
        accepted = None
        if draws:
            q = tree.q[node]
            u = torch.rand(len(draws), generator=generator, device=p.device, dtype=p.dtype)
            for i, child in enumerate(draws):
                x = tree.tokens[child]
                if float(u[i] * q[x]) < float(residual[x]):
                    accepted = child
                    break
                nxt = torch.clamp(residual - q, min=0)
                total = float(nxt.sum())
                if total > 0:  # total == 0 only when residual == q (rejection impossible)
                    residual = nxt / total
        if accepted is None:
            tok = int(torch.multinomial(residual, 1, generator=generator)[0])
            return TreeVerdict(path, tok, bool(draws))
        path.append(accepted)
        node = accepted
