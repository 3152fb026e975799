"""Logit processing and the acceptance rules, kept free of model code so they can be
tested directly on hand-written distributions.

Losslessness of speculative sampling needs the same temperature / top-k / top-p on the
target's p and the drafter's q, so both go through :func:`probs_from_logits`.
"""

from __future__ import annotations

import torch


def probs_from_logits(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Softmax over the last axis after temperature, top-k and top-p (nucleus) filtering."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0 for sampling; use greedy for 0")
    x = logits.float() / temperature
    if top_k is not None and 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_x, idx = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p
        drop_sorted = (cum - torch.softmax(sorted_x, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)) = 1 - TV(p, q), per row."""
    return torch.minimum(p, q).sum(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def speculative_verify(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[int, int, list[float]]:
    """Exact speculative sampling (Leviathan et al. 2023, Chen et al. 2023).

    ``p``: target probabilities ``[n+1, V]`` (row ``i`` is the distribution of the token
    at draft position ``i``; row ``n`` is for the bonus token). ``q``: drafter
    probabilities ``[n, V]`` the draft tokens were sampled from. Accept draft ``i`` with
    probability ``min(1, p/q)``; at the first rejection sample from ``norm(max(0, p-q))``;
    when all are accepted sample the bonus from ``p[n]``.

    Returns ``(n_accepted, next_token, betas)`` where ``betas`` are
    ``sum min(p, q)`` at each verified position (the positions actually reached).
    """
    n = draft.shape[0]
    if n == 0:
        return 0, int(sample(p[0:1], generator)[0]), []
    rows = torch.arange(n, device=p.device)
    p_d = p[rows, draft]
    q_d = q[rows, draft]
    u = torch.rand(n, generator=generator, device=p.device, dtype=p.dtype)
    accept = u * q_d < p_d  # u < p/q without dividing by a possibly-zero q
    rejected = (~accept).nonzero()
    n_acc = int(rejected[0, 0]) if rejected.numel() else n
    n_verified = min(n_acc + 1, n)
    betas = overlap(p[:n_verified], q[:n_verified]).tolist()
    if n_acc == n:
        return n, int(sample(p[n : n + 1], generator)[0]), betas
    residual = torch.clamp(p[n_acc] - q[n_acc], min=0)
    total = residual.sum()
    if float(total) <= 0:  # p == q: rejection has probability 0; guard numerics anyway
        residual = p[n_acc]
    return n_acc, int(sample(residual.unsqueeze(0) / residual.sum(), generator)[0]), betas


def typical_accept(
    p: torch.Tensor, draft: torch.Tensor, epsilon: float, delta: float
) -> torch.Tensor:
    """Medusa typical acceptance (lossy): accept ``x`` when
    ``p(x) > min(epsilon, delta * exp(-H(p)))``. Returns one bool per row."""
    rows = torch.arange(draft.shape[0], device=p.device)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(dim=-1)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    return p[rows, draft] > threshold
