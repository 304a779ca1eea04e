"""Verification: keep the longest prefix of the proposals the target model accepts, plus one token.

For proposal d_j drawn from the draft distribution q_j, the target's distribution at that
position is p_j. Accept d_j with probability min(1, p_j(d_j) / q_j(d_j)); on the first rejection,
draw the replacement from the residual max(0, p_j - q_j), normalised, and stop. If all k are
accepted, draw a bonus token from p_k. The token that comes out at each position is then
distributed exactly as p_j (Leviathan et al. 2023; Chen et al. 2023), whatever the draft.

Greedy requests are the limit of this at temperature 0: accept while the target's argmax equals
the proposal; the first mismatch is replaced by the argmax. N-gram proposals carry no
distribution: q is a point mass on the proposed token, so acceptance is p(d) and the residual
is p with d removed.
"""
from __future__ import annotations

import torch

from ..engine.sampling import apply_min_p, apply_top_k_top_p


def target_probs(logits: torch.Tensor, params) -> torch.Tensor:
    """The distribution the plain sampler draws from (temperature, min-p, top-k, top-p), for each row."""
    t = params.temperature if params.temperature > 0 else 1.0
    rows = logits.shape[0]
    top_k = torch.full((rows,), params.top_k, device=logits.device)
    top_p = torch.full((rows,), float(params.top_p), device=logits.device)
    min_p = torch.full((rows,), float(params.min_p), device=logits.device)
    return apply_top_k_top_p(apply_min_p(logits / t, min_p), top_k, top_p).softmax(dim=-1)


def accept_greedy(argmax: list[int], proposal: list[int]) -> list[int]:
    """argmax: the target's choice after each proposed prefix (len(proposal) + 1 entries)."""
    out = []
    for want, got in zip(argmax, proposal):
        out.append(want)
        if want != got:
            return out
    out.append(argmax[len(proposal)])
    return out


def accept_sampled(p: torch.Tensor, proposal: list[int], q: torch.Tensor | None, generator=None) -> list[int]:
    """p [k+1, V]: target probabilities after each proposed prefix; q [k, V] the draft's (None: point
    masses on the proposals). Returns the accepted proposals plus one corrected or bonus token."""
    k = len(proposal)
    if k:
        d = torch.tensor(proposal, device=p.device)
        p_d = p[torch.arange(k, device=p.device), d]
        q_d = torch.ones_like(p_d) if q is None else q[torch.arange(k, device=p.device), d]
        u = torch.rand(k, generator=generator, device=p.device)
        rejected = (u * q_d >= p_d).nonzero()  # u < p/q accepts; written without dividing by q
        if len(rejected):
            j = int(rejected[0])
            if q is None:
                residual = p[j].clone()
                residual[proposal[j]] = 0
            else:
                residual = (p[j] - q[j]).clamp_(min=0)
            if residual.sum() <= 0:  # p == q up to rounding: nothing left to correct
                residual = p[j]
            token = torch.multinomial(residual / residual.sum(), 1, generator=generator)
            return proposal[:j] + [int(token)]
    return proposal + [int(torch.multinomial(p[k], 1, generator=generator))]
