"""Batched next-token selection: constraints -> logits rules -> temperature -> min-p -> top-k -> top-p -> sample.

All rows of a step go through one set of tensor ops. Greedy rows take the argmax of the
raw (masked) logits. A sampled row draws with the exponential-race trick (argmax of
p / E, E ~ Exp(1), which picks token i with probability p_i), so a per-request
`torch.Generator` makes its draw reproducible whatever else is in the batch.
"""
from __future__ import annotations

import torch

from .logits_processors import apply_logits_rules, rows_of
from ..core.sequence import Sequence


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) everything outside each row's top-k and top-p nucleus. top_k <= 0 means off."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, logits.shape[-1]).unsqueeze(1)
    drop = rank >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # drop a token if the tokens ranked before it already cover top_p; the first always stays
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p.unsqueeze(1)
    drop[:, 0] = False  # a top_p that rounds to 0 in float32 (below ~1.4e-45) keeps the top token: greedy
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below min_p times the row's top probability (vLLM's min_p:
    after the temperature, before top-k/top-p). Compared as logits: p_i < min_p * p_max is
    logit_i < logit_max + log(min_p), with no softmax; min_p = 0 gives -inf, which drops nothing."""
    if not bool((min_p > 0).any()):
        return logits
    floor = logits.amax(dim=-1, keepdim=True) + min_p.log().unsqueeze(1)
    return logits.masked_fill(logits < floor, float("-inf"))


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's largest entry (the first of equal ones, like argmax). `max` rather than `argmax`: on a
    CPU it is several times faster over a large vocabulary (the README's CPU-path list has the timing)."""
    return logits.max(dim=-1).indices


@torch.inference_mode()
def sample(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids=()) -> list[int]:
    """logits [N, V] float32 for the N sequences that pick a token this step (left unchanged)."""
    constrained = [i for i, seq in enumerate(seqs) if seq.sampling.constraint is not None]
    if constrained:
        logits = logits.clone()
        for i in constrained:
            logits[i] += seqs[i].sampling.constraint.mask()
    if any(seq.params.adjusts_logits for seq in seqs):
        logits = apply_logits_rules(logits, rows_of(seqs), eos_token_ids)
    greedy = [seq.params.greedy for seq in seqs]
    if all(greedy):
        return greedy_tokens(logits).tolist()
    params = [seq.params for seq in seqs]
    device, vocab_size = logits.device, logits.shape[-1]
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=device)
    # any top_k outside [1, V] keeps the whole vocabulary (and a huge int never reaches torch)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    min_p = torch.tensor([p.min_p for p in params], device=device)
    probs = apply_top_k_top_p(apply_min_p(logits / temps.unsqueeze(1), min_p), top_k, top_p).softmax(dim=-1)
    noise = torch.empty_like(probs)
    for i, seq in enumerate(seqs):
        noise[i].exponential_(generator=seq.sampling.generator)
    sampled = greedy_tokens(probs / noise)
    tokens = torch.where(torch.tensor(greedy, device=device), greedy_tokens(logits), sampled)
    return tokens.tolist()


def seeded_generator(seed: int, index: int, device: torch.device) -> torch.Generator:
    """Sample `index` of a request seeded with `seed` draws from seed + index (wrapped to 64 bits)."""
    return torch.Generator(device).manual_seed((seed + index) % 2**64)
