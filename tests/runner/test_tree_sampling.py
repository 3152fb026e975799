"""Token-tree verification under sampling reproduces the target's distribution exactly,
and the test has the power to see the two classic mistakes.

A toy bigram target ``P[prev] -> next`` and a deliberately different bigram draft ``Q`` on
a 4-token vocabulary: trees of draft candidates (EAGLE-2 dynamic and Medusa-style static
shapes, i.i.d. sampled siblings with repeats) are verified with recursive rejection
sampling until two tokens are out; their joint distribution must be
``P[start][x] * P[x][y]`` (chi-square, fixed seeds). The same harness with siblings
accepted naively (no residual update between siblings), or with top-k siblings checked by
the ``min(1, p/q)`` rule, must be rejected by the same chi-square test.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from runner.tree import (
    DraftTree,
    DynamicTree,
    StaticTree,
    TreeVerdict,
    build_tree,
    verify_greedy,
    verify_sampling,
)

V = 4
START = V  # row of the start context
# chi-square critical value, df = 15, p = 0.001
CHI2_CRIT_DF15 = 37.70
N_TRIALS = 4000

P = torch.tensor(
    [
        [0.50, 0.25, 0.15, 0.10],
        [0.10, 0.20, 0.30, 0.40],
        [0.25, 0.25, 0.25, 0.25],
        [0.05, 0.15, 0.30, 0.50],
        [0.40, 0.30, 0.20, 0.10],  # start
    ],
    dtype=torch.float64,
)
Q = torch.tensor(
    [
        [0.10, 0.40, 0.40, 0.10],
        [0.40, 0.30, 0.20, 0.10],
        [0.70, 0.10, 0.10, 0.10],
        [0.25, 0.25, 0.25, 0.25],
        [0.15, 0.15, 0.35, 0.35],  # start
    ],
    dtype=torch.float64,
)

Verifier = Callable[[torch.Tensor, DraftTree, torch.Generator], TreeVerdict]


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=-1)


def _two_tokens(shape, verify: Verifier, gen: torch.Generator, greedy_tree: bool = False):
    """Decode until two tokens are out; trees of depth 2 below the newest token."""
    last, out = START, []

    def expand(tree: DraftTree, nodes: list[int]) -> torch.Tensor:
        return torch.log(Q[[tree.tokens[n] for n in nodes]])

    while len(out) < 2:
        probs = None if greedy_tree else _softmax
        tree = build_tree(shape, torch.log(Q[last]), expand, 2, probs, gen)
        if greedy_tree:  # top-k siblings, then (wrongly) checked against q
            tree.q = {-1: Q[last], **{n: Q[tree.tokens[n]] for n in range(len(tree))}}
        rows = torch.stack([P[last]] + [P[t] for t in tree.tokens])
        verdict = verify(rows, tree, gen)
        out += [tree.tokens[n] for n in verdict.path] + [verdict.next_token]
        last = out[-1]
    return out[0], out[1]


def _chi2(shape, verify: Verifier, seed: int, greedy_tree: bool = False) -> float:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V, dtype=torch.float64)
    for _ in range(N_TRIALS):
        x, y = _two_tokens(shape, verify, gen, greedy_tree)
        counts[x, y] += 1
    expected = P[START][:, None] * P[:V] * N_TRIALS
    return float(((counts - expected) ** 2 / expected).sum())


def _naive(p: torch.Tensor, tree: DraftTree, gen: torch.Generator) -> TreeVerdict:
    """The mistake: every sibling is checked against the *original* p."""
    node, path = -1, []
    while True:
        draws = tree.draws.get(node, [])
        p_node = p[node + 1]
        accepted = None
        for child in draws:
            x = tree.tokens[child]
            q = tree.q[node]
            if float(torch.rand(1, generator=gen, dtype=p.dtype)) * float(q[x]) < float(p_node[x]):
                accepted = child
                break
        if accepted is None:
            res = torch.clamp(p_node - tree.q[node], min=0) if draws else p_node
            res = res / res.sum() if float(res.sum()) > 0 else p_node
            tok = int(torch.multinomial(res, 1, generator=gen)[0])
            return TreeVerdict(path, tok, bool(draws))
        path.append(accepted)
        node = accepted


DYNAMIC = DynamicTree(top_k=3, total_tokens=6)
STATIC = StaticTree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0)))


@pytest.mark.parametrize("shape", [DYNAMIC, STATIC], ids=["dynamic", "static"])
def test_tree_sampling_preserves_target_distribution(shape):
    assert _chi2(shape, verify_sampling, seed=11) < CHI2_CRIT_DF15


def test_naive_sibling_acceptance_is_detected():
    # if this passed, the chi-square test above would prove nothing
    assert _chi2(DYNAMIC, _naive, seed=11) > CHI2_CRIT_DF15


def test_top_k_siblings_with_q_rule_are_detected():
    assert _chi2(DYNAMIC, verify_sampling, seed=11, greedy_tree=True) > CHI2_CRIT_DF15


def test_sampled_trees_repeat_draws_but_not_nodes():
    gen = torch.Generator().manual_seed(3)
    repeats = 0
    for _ in range(200):
        tree = build_tree(
            DynamicTree(top_k=4, total_tokens=12),
            torch.log(Q[START]),
            lambda t, nodes: torch.log(Q[[t.tokens[n] for n in nodes]]),
            3,
            _softmax,
            gen,
        )
        for parent, kids in tree.draws.items():
            tokens = [tree.tokens[c] for c in kids]
            # every draw is kept in order; equal tokens share one node
            assert len({tree.tokens[c] for c in set(kids)}) == len(set(kids))
            repeats += len(tokens) - len(set(tokens))
            assert all(tree.parents[c] == parent for c in kids)
        assert sum(len(k) for k in tree.draws.values()) <= 12
    assert repeats > 0


def test_greedy_tree_accepts_longest_matching_path():
    tree = DraftTree(
        tokens=[1, 2, 3, 0, 1],
        parents=[-1, -1, 0, 0, 3],
        depths=[1, 1, 2, 2, 3],
        draws={-1: [0, 1], 0: [2, 3], 3: [4]},
    )
    # rows: pending, node0..node4; target argmax follows 1 -> 0 -> 1 -> 2
    verdict = verify_greedy([1, 0, 9, 9, 1, 2], tree)
    assert verdict.path == [0, 3, 4] and verdict.next_token == 2 and not verdict.rejected
    verdict = verify_greedy([2, 9, 3], tree)  # 2 accepted (node 1, a leaf), then 3
    assert verdict.path == [1] and verdict.next_token == 3 and not verdict.rejected
    verdict = verify_greedy([0, 9], tree)
    assert verdict.path == [] and verdict.next_token == 0 and verdict.rejected
