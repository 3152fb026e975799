"""Token-tree verification under sampling reproduces the target's distribution exactly,
and the test has the power to see the two classic mistakes.

A toy bigram target ``P[prev] -> next`` and a deliberately different bigram draft ``Q`` on
a 4-token vocabulary: trees of draft candidates (EAGLE-2 dynamic and Medusa-style static
shapes, siblings sampled without replacement) are verified with recursive rejection
sampling until two tokens are out; their joint distribution must be
``P[start][x] * P[x][y]`` (chi-square, fixed seeds). The same harness with siblings
accepted naively (checked against the original p), with the residual updated but the
proposal not renormalised after each removal (the with-replacement rule applied to
without-replacement siblings), or with top-k siblings checked by the ``min(1, p/q)`` rule,
must be rejected by the same chi-square test. The sibling sampler itself is checked
against the without-replacement law of its first two draws.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from runner.tree import (
    AcceptanceProfile,
    DraftTree,
    DynamicTree,
    SiblingDraws,
    StaticTree,
    TreeVerdict,
    build_tree,
    residual_after_rejection,
    verify_greedy,
    verify_sampling,
)

V = 4
START = V  # row of the start context
# chi-square critical values, p = 0.001
CHI2_CRIT_DF15 = 37.70
CHI2_CRIT_DF11 = 31.26
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


def _two_tokens(
    shape,
    verify: Verifier,
    gen: torch.Generator,
    greedy_tree: bool = False,
    profile: AcceptanceProfile | None = None,
):
    """Decode until two tokens are out; trees of depth 2 below the newest token. With a
    ``profile``, each sampled dynamic tree is planned from the outcomes of earlier ones."""
    last, out = START, []

    def expand(tree: DraftTree, nodes: list[int]) -> torch.Tensor:
        return torch.log(Q[[tree.tokens[n] for n in nodes]])

    while len(out) < 2:
        probs = None if greedy_tree else _softmax
        tree = build_tree(shape, torch.log(Q[last]), expand, 2, probs, gen, profile)
        if greedy_tree:  # top-k siblings, then (wrongly) checked against q
            tree.q = {-1: Q[last], **{n: Q[tree.tokens[n]] for n in range(len(tree))}}
        rows = torch.stack([P[last]] + [P[t] for t in tree.tokens])
        verdict = verify(rows, tree, gen)
        new = [tree.tokens[n] for n in verdict.path] + [verdict.next_token]
        if profile is not None:
            profile.observe(tree, new)
        out += new
        last = out[-1]
    return out[0], out[1]


def _chi2(
    shape,
    verify: Verifier,
    seed: int,
    greedy_tree: bool = False,
    profile: AcceptanceProfile | None = None,
) -> float:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V, dtype=torch.float64)
    for _ in range(N_TRIALS):
        x, y = _two_tokens(shape, verify, gen, greedy_tree, profile)
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


def _not_renormalised(p: torch.Tensor, tree: DraftTree, gen: torch.Generator) -> TreeVerdict:
    """The other mistake: the residual is updated after each rejection, but every sibling
    is checked against the *original* q, as if siblings were drawn with replacement."""
    node, path = -1, []
    while True:
        residual = p[node + 1]
        draws = tree.draws.get(node, [])
        accepted = None
        for child in draws:
            x = tree.tokens[child]
            q = tree.q[node]
            u = float(torch.rand(1, generator=gen, dtype=p.dtype))
            if u * float(q[x]) < float(residual[x]):
                accepted = child
                break
            residual = residual_after_rejection(residual, q)
        if accepted is None:
            tok = int(torch.multinomial(residual, 1, generator=gen)[0])
            return TreeVerdict(path, tok, bool(draws))
        path.append(accepted)
        node = accepted


DYNAMIC = DynamicTree(top_k=3, total_tokens=6)
STATIC = StaticTree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0)))


@pytest.mark.parametrize("shape", [DYNAMIC, STATIC], ids=["dynamic", "static"])
def test_tree_sampling_preserves_target_distribution(shape):
    # without-replacement siblings, verified by verify_sampling
    assert _chi2(shape, verify_sampling, seed=11) < CHI2_CRIT_DF15


def test_trees_planned_from_past_outcomes_stay_exact():
    # the shape changes as the profile learns (the prior's c_1 = 0.35 is far off here),
    # but it is fixed before each tree's draws, so the output law is unchanged
    profile = AcceptanceProfile(prior_weight=1.0)
    before = profile.plan(3, 6, 2)
    assert _chi2(DynamicTree(top_k=3, total_tokens=4), verify_sampling, 7, profile=profile) < (
        CHI2_CRIT_DF15
    )
    assert sum(profile.reached) > N_TRIALS
    assert profile.plan(3, 6, 2) != before


def test_naive_sibling_acceptance_is_detected():
    # if this passed, the chi-square test above would prove nothing
    assert _chi2(DYNAMIC, _naive, seed=11) > CHI2_CRIT_DF15


@pytest.mark.parametrize("shape", [DYNAMIC, STATIC], ids=["dynamic", "static"])
def test_unrenormalised_proposal_is_detected(shape):
    assert _chi2(shape, _not_renormalised, seed=11) > CHI2_CRIT_DF15


def test_top_k_siblings_with_q_rule_are_detected():
    assert _chi2(DYNAMIC, verify_sampling, seed=11, greedy_tree=True) > CHI2_CRIT_DF15


def test_sibling_draws_follow_sampling_without_replacement():
    """First two draws (a, b): probability q(a) * q(b) / (1 - q(a)), a != b."""
    q = Q[START]
    gen = torch.Generator().manual_seed(5)
    counts = torch.zeros(V, V, dtype=torch.float64)
    for _ in range(N_TRIALS):
        s = SiblingDraws(q, gen)
        a, b = s.next(), s.next()
        counts[a, b] += 1
    law = q[:, None] * q[None, :] / (1 - q[:, None])
    law.fill_diagonal_(0)
    assert float(counts.diagonal().sum()) == 0
    off = ~torch.eye(V, dtype=torch.bool)
    expected = law[off] * N_TRIALS
    assert float(((counts[off] - expected) ** 2 / expected).sum()) < CHI2_CRIT_DF11


def test_sibling_draws_stop_at_the_support():
    q = torch.tensor([0.0, 0.7, 0.0, 0.3], dtype=torch.float64)
    s = SiblingDraws(q, torch.Generator().manual_seed(0))
    assert sorted([s.next(), s.next()]) == [1, 3] and s.exhausted


def test_sampled_trees_have_distinct_siblings_within_budget():
    gen = torch.Generator().manual_seed(3)
    sizes = set()
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
            assert len(tokens) == len(set(tokens)) <= 4
            assert all(tree.parents[c] == parent for c in kids)
            assert all(float(tree.q[parent][t]) > 0 for t in tokens)
        assert len(tree) <= 12 and tree.max_depth <= 3
        sizes.add(len(tree))
    assert max(sizes) == 12


def test_profile_counts_each_rank_the_walk_tried():
    tree = DraftTree(
        tokens=[1, 2, 3, 0, 1],
        parents=[-1, -1, -1, 1, 1],
        depths=[1, 1, 1, 2, 2],
        draws={-1: [0, 1, 2], 1: [3, 4]},
    )
    profile = AcceptanceProfile()
    profile.observe(tree, [2, 1, 5])  # rank 1 at the root, then rank 1 below, then a leaf
    assert profile.reached == [2.0, 2.0] and profile.accepted == [0.0, 2.0]
    profile.observe(tree, [2, 3])  # rank 1, then both children rejected (3 is emitted)
    assert profile.reached == [4.0, 4.0] and profile.accepted == [0.0, 3.0]
    profile.observe(tree, [1, 9])  # rank 0, a leaf: nothing more to learn
    assert profile.reached == [5.0, 4.0] and profile.accepted == [1.0, 3.0]


@pytest.mark.parametrize("first", [0.95, 0.3])
def test_plan_respects_eagle2_limits(first):
    profile = AcceptanceProfile(prior=(first, 0.3, 0.2))
    shape = profile.plan(top_k=3, total=10, depth=4)
    choices = set(shape.choices)
    assert len(choices) == 10 and shape.depth <= 4
    assert all(c[:-1] in choices or len(c) == 1 for c in choices)  # prefix-closed
    assert all(max(c) < 3 for c in choices)  # top_k draws per node
    for d in range(1, 4):  # at most top_k expanded nodes per depth
        assert len({c[:d] for c in choices if len(c) > d}) <= 3
    # a head whose first draw is usually accepted gets a deep tree, a poor one a wide one
    assert shape.depth == (4 if first > 0.5 else 3)


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
