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
* **sampling** (recursive rejection sampling over siblings drawn *without replacement*,
  Jeon et al. 2024, "Recursive Speculative Decoding"): at the current node with target
  distribution ``p`` and children ``x_1, x_2, …`` drawn from the drafter's ``q`` without
  replacement, start with ``r = p`` and ``q_1 = q`` and try the children in draw order:
  accept ``x_i`` with probability ``min(1, r(x_i) / q_i(x_i))``; on rejection set
  ``r <- norm(max(0, r - q_i))`` and ``q_{i+1} = q_i`` with ``x_i`` removed and renormalised;
  when every child is rejected, sample the emitted token from the final ``r``. Round ``i``
  is one ordinary speculative-sampling step of the current residual ``r`` against the
  current proposal ``q_i``, and ``x_i`` (given the draws before it) is exactly a draw from
  ``q_i``; such a step emits a token distributed as ``r`` whatever happens after a
  rejection, as long as what happens after it emits the *next* residual exactly. By
  induction from the last round (which samples the residual itself) the node emits a
  token distributed as ``p``; once a child is accepted the same argument restarts below it.
  A rejected ``x_i`` has ``r(x_i) <= q_i(x_i)``, so the next residual gives it probability 0,
  consistent with removing it from the proposal. Checking later siblings against the
  original ``q`` (the with-replacement rule) or the original ``p`` is *not* exact; the
  chi-square tests in ``tests/runner/test_tree_sampling.py`` reject both.

Why sibling candidates must be *sampled* when sampling: the rule above is exact only for
candidates that really were drawn from ``q_i``. The top-k tokens of ``q`` were not: checking
them with it over-accepts the draft's favourite tokens (a rejected test shows the skew).
Sampling without replacement keeps the exactness and never wastes a node on a repeat, which
i.i.d. draws do whenever ``q`` is peaked. The draws come from Gumbel-top-k
(:class:`SiblingDraws`): tokens sorted by ``log q + Gumbel`` noise are successive draws
without replacement, revealed one at a time.

The tree's *shape* may depend on anything known before a node's draws are made (the
history of earlier steps, the node's own path and distribution), never on the draws
themselves nor on the verifier's coins: then, at every node, draw ``j`` is still a draw
from ``q_j`` whatever the shape, and the round-by-round argument holds (a node with fewer
draws just samples its residual sooner). Dropping a drawn sibling because of its own value
would break this. Under greedy decoding any tree is exact, so EAGLE-2's rerank (keep the
best ``total_tokens`` nodes by cumulative draft confidence) is used there as published.
Under sampling every drawn node is verified, and a dynamic tree's shape is a rank tree
planned before anything is drawn (:class:`AcceptanceProfile`, Sequoia-style): the drafter
counts, over the trees it has seen verified, how often the ``j``-th draw below a node was
accepted after the earlier ones were rejected; a node's value is the product of those
rates along its path, and the ``total_tokens`` most valuable nodes are kept (best-first,
with EAGLE-2's ``top_k`` draws per node and ``top_k`` expanded nodes per depth). Draft
confidence (EAGLE-2's score) is not used there: a sampled draw is accepted with probability
``min(1, p/q)``, often even when ``q`` is flat, so confidence products made the sampled
trees wide and shallow and lowered tau on the tiny heads.
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
    # parent (-1 = root) -> child node ids in draw order (distinct tokens)
    draws: dict[int, list[int]] = field(default_factory=dict)
    # parent -> the distribution its children were drawn from without replacement (sampling)
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


class SiblingDraws:
    """An ordered sample *without replacement* from ``q``, revealed one draw at a time.

    Gumbel-top-k: with ``g_x`` i.i.d. Gumbel(0, 1), the tokens sorted by ``log q(x) + g_x``
    are distributed as successive draws without replacement (Plackett-Luce), and the
    ``j``-th of them, given the first ``j - 1``, is a draw from ``q`` with those removed and
    renormalised. So the keys are drawn once and the draws read off in order.
    """

    def __init__(self, q: torch.Tensor, generator: torch.Generator | None) -> None:
        self.q = q
        q64 = q.double()
        u = torch.rand(q.shape, generator=generator, device=q.device, dtype=torch.float64)
        keys = torch.log(q64) - torch.log(-torch.log(u))
        keys = keys.masked_fill(q64 <= 0, float("-inf"))
        support = int((q64 > 0).sum())
        self.order: list[int] = torch.argsort(keys, descending=True)[:support].tolist()
        self.taken = 0

    @property
    def exhausted(self) -> bool:
        return self.taken >= len(self.order)

    def next(self) -> int:
        tok = self.order[self.taken]
        self.taken += 1
        return tok


class TreeBuilder:
    """Grows a :class:`DraftTree` layer by layer from draft logits."""

    def __init__(self, probs: ProbFn | None, generator: torch.Generator | None) -> None:
        self.probs = probs  # None = greedy
        self.generator = generator
        self.tree = DraftTree()
        self.scores: list[float] = []  # cumulative log draft probability per node
        self.samplers: dict[int, SiblingDraws] = {}  # parent -> its children's draws

    @property
    def greedy(self) -> bool:
        return self.probs is None

    def score(self, node: int) -> float:
        return 0.0 if node < 0 else self.scores[node]

    def open(self, parent: int, q: torch.Tensor) -> SiblingDraws:
        """Record ``parent``'s draft distribution (processed) and prepare its draws."""
        self.tree.q[parent] = q
        sampler = SiblingDraws(q, self.generator)
        self.samplers[parent] = sampler
        return sampler

    def draw(self, parent: int) -> int:
        """Add ``parent``'s next child (its next draw without replacement)."""
        sampler = self.samplers[parent]
        tok = sampler.next()
        depth = 1 if parent < 0 else self.tree.depths[parent] + 1
        conf = math.log(max(float(sampler.q[tok]), 1e-30))
        node = self._new(parent, tok, depth, self.score(parent) + conf)
        self.tree.draws.setdefault(parent, []).append(node)
        return node

    def add_children(
        self,
        parent: int,
        logits: torch.Tensor,
        n: int,
        ranks: set[int] | None = None,
    ) -> list[int | None]:
        """Add up to ``n`` children below ``parent``: the top ``n`` distinct tokens
        (greedy; only those whose rank is in ``ranks`` when given, ``None`` for the others)
        or the first ``n`` draws without replacement (sampling; fewer when ``q`` has a
        smaller support)."""
        if n <= 0:
            return []
        if not self.greedy:
            sampler = self.open(parent, self.probs(logits))  # type: ignore[misc]
            return [self.draw(parent) for _ in range(min(n, len(sampler.order)))]
        t = self.tree
        depth = 1 if parent < 0 else t.depths[parent] + 1
        base = self.score(parent)
        out: list[int | None] = []
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
    profile: AcceptanceProfile | None = None,
) -> DraftTree:
    """Grow a tree of at most ``max_depth`` levels.

    ``root_logits``: the draft's logits for the first candidate position. ``expand(tree, nodes)``
    returns the draft's logits below each of ``nodes`` (all at one depth), in order; it is
    called once per depth, for the nodes that get children. ``profile``: the positional
    acceptance a sampled dynamic tree is planned from (a fresh prior when ``None``).
    """
    b = TreeBuilder(probs, generator)
    if max_depth <= 0:
        return b.tree
    if isinstance(shape, StaticTree):
        return _build_static(b, shape, root_logits, expand, max_depth)
    return _build_dynamic(b, shape, root_logits, expand, max_depth, profile)


def _build_static(
    b: TreeBuilder,
    shape: StaticTree,
    root_logits: torch.Tensor,
    expand: ExpandFn,
    max_depth: int,
) -> DraftTree:
    """Greedy: slot ``(…, r)`` is the rank-``r`` candidate. Sampling: a node with ``m``
    child slots gets its first ``m`` draws without replacement, and slot ``j`` follows
    draw ``j`` (slots past the support of ``q`` stay empty)."""
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
                for slot, child in zip(slots, made, strict=False):  # made may be shorter
                    assert child is not None
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
    profile: AcceptanceProfile | None,
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
    # sampling: a shape fixed before anything is drawn; keep everything drawn
    return _build_sampled(b, k, budget, root_logits, expand, max_depth, profile)


def _build_sampled(
    b: TreeBuilder,
    k: int,
    budget: int,
    root_logits: torch.Tensor,
    expand: ExpandFn,
    max_depth: int,
    profile: AcceptanceProfile | None = None,
) -> DraftTree:
    """EAGLE-2's budget under sampling: a rank tree planned from the positional
    acceptance profile (what is known before anything is drawn), grown with draws
    without replacement; every draw is verified."""
    plan = (profile or AcceptanceProfile()).plan(k, budget, max_depth)
    return _build_static(b, plan, root_logits, expand, max_depth)


@dataclass
class AcceptanceProfile:
    """How often the ``j``-th draw below a node is accepted, given the walk reached the
    node and rejected draws ``0 … j - 1`` (Sequoia's positional acceptance vector), as
    counts with a prior, updated from the trees the target has verified.

    Under sampling a node's value is the chance the walk accepts it: the product, along
    its path, of ``a_j = c_j * prod_{i<j} (1 - c_i)`` for the node's draw rank ``j``
    (``c`` the conditional rates). The draft's own confidence is a poor proxy here: a
    sampled draw is accepted with probability ``min(1, p/q)``, often even when ``q`` is
    flat, so confidence products make trees too wide and too shallow. The profile is
    learned from past steps only, so a tree planned from it is fixed before its draws.
    """

    prior: tuple[float, ...] = (0.7, 0.35, 0.3)  # c_0, c_1, then c_j for every j >= 2
    prior_weight: float = 8.0
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def conditional(self, j: int) -> float:
        c0 = self.prior[min(j, len(self.prior) - 1)]
        n = self.reached[j] if j < len(self.reached) else 0.0
        a = self.accepted[j] if j < len(self.accepted) else 0.0
        return (a + self.prior_weight * c0) / (n + self.prior_weight)

    def _count(self, j: int, accepted: bool) -> None:
        while len(self.reached) <= j:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        self.reached[j] += 1
        self.accepted[j] += float(accepted)

    def observe(self, tree: DraftTree, new_tokens: Sequence[int]) -> None:
        """Learn from a verified tree: ``new_tokens`` = the tokens that step emitted (the
        accepted path, then the next token; possibly cut short at an end token). At each
        node the walk reached, the emitted token is either the accepted child (rank ``j``)
        or none of the children (every draw rejected: a rejected draw has residual
        probability 0, so it cannot be emitted afterwards)."""
        node = -1
        for tok in new_tokens:
            kids = tree.draws.get(node, [])
            if not kids:
                return
            hit = next((j for j, c in enumerate(kids) if tree.tokens[c] == tok), None)
            for j in range(len(kids) if hit is None else hit + 1):
                self._count(j, j == hit)
            if hit is None:
                return
            node = kids[hit]

    def rank_values(self, k: int) -> list[float]:
        """``a_j`` for ``j < k``: the chance that draw ``j`` is the accepted one."""
        out, rejected = [], 1.0
        for j in range(k):
            c = self.conditional(j)
            out.append(rejected * c)
            rejected *= 1 - c
        return out

    def plan(self, top_k: int, total: int, depth: int) -> StaticTree:
        """The ``total`` most valuable nodes, best-first (so ancestor-closed: a child is
        worth less than its parent, a later sibling less than an earlier one while the
        ``a_j`` decrease), with at most ``top_k`` draws per node, ``top_k`` expanded nodes
        per depth and ``depth`` levels: EAGLE-2's limits."""
        a = self.rank_values(top_k)
        expanded = [0] * (depth + 1)
        chosen: list[tuple[int, ...]] = []
        # (-value of the slot, tiebreak, parent path, rank, parent value)
        heap: list[tuple[float, int, tuple[int, ...], int, float]] = [(-a[0], 0, (), 0, 1.0)]
        tick = 1
        while heap and len(chosen) < total:
            neg, _, parent, j, pv = heapq.heappop(heap)
            d = len(parent)  # depth of the parent (0 = root)
            if j == 0 and d > 0:
                if expanded[d] >= top_k:
                    continue  # this layer's expansions are used up
                expanded[d] += 1
            path = (*parent, j)
            chosen.append(path)
            if j + 1 < top_k:
                heapq.heappush(heap, (-pv * a[j + 1], tick, parent, j + 1, pv))
                tick += 1
            if len(path) < depth:
                heapq.heappush(heap, (neg * a[0], tick, path, 0, -neg))
                tick += 1
        return StaticTree(tuple(sorted(chosen)))


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
    """Recursive rejection sampling over siblings drawn without replacement; ``p[r]`` =
    processed target probabilities at row ``r``. Exact whatever ``q`` was, as long as each
    child list is an ordered sample without replacement from ``tree.q[parent]`` (see the
    module docstring)."""
    node, path = -1, []
    while True:
        residual = p[node + 1]
        draws = tree.draws.get(node, [])
        accepted = None
        if draws:
            q = tree.q[node].to(residual.dtype)
            u = torch.rand(len(draws), generator=generator, device=p.device, dtype=p.dtype)
            for i, child in enumerate(draws):
                x = tree.tokens[child]
                if float(u[i] * q[x]) < float(residual[x]):
                    accepted = child
                    break
                residual = residual_after_rejection(residual, q)
                q = without(q, x)
        if accepted is None:
            tok = int(torch.multinomial(residual, 1, generator=generator)[0])
            return TreeVerdict(path, tok, bool(draws))
        path.append(accepted)
        node = accepted


def residual_after_rejection(residual: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, residual - q))``: what the target still owes after a draw from ``q``
    was rejected. Its total is 0 only when ``residual == q``, where rejection has
    probability 0; the residual is kept then (numerical guard)."""
    nxt = torch.clamp(residual - q, min=0)
    total = float(nxt.sum())
    return nxt / total if total > 0 else residual


def without(q: torch.Tensor, token: int) -> torch.Tensor:
    """``q`` with ``token`` removed and renormalised: the distribution of the next draw
    without replacement. A ``q`` with nothing left stays all zero (no further draw
    exists then)."""
    out = q.clone()
    out[token] = 0
    total = float(out.sum())
    return out / total if total > 0 else out
