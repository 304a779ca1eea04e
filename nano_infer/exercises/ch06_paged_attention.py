"""Chapter 06 exercises: K/V gathered through a block table, attention one key chunk at a time, merging partial results."""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from .core import call, exercise, expect, forall


def _close(got, want, desc: str, what: str, atol: float = 1e-4) -> None:
    expect(isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape), desc, tuple(want.shape),
           tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__, why=f"shape of {what}:")
    diff = (got.double() - want.double()).abs()
    bad = ~(diff <= atol)  # NaN counts as bad
    if bool(bad.any()):
        row = int(bad.reshape(bad.shape[0], -1).any(-1).nonzero()[0])
        expect(False, desc, want[row].tolist(), got[row].tolist(),
               why=f"wrong values in {what} (row {row}, largest error {diff.nan_to_num(math.inf).max().item():.3g}):")


@st.composite
def _gather_cases(draw):
    num_blocks, block_size = draw(st.integers(1, 12)), draw(st.integers(1, 5))
    table = draw(st.lists(st.integers(0, num_blocks - 1), min_size=1, max_size=num_blocks, unique=True))
    context_len = draw(st.integers(1, len(table) * block_size))
    return num_blocks, block_size, table, context_len, draw(st.integers(0, 2**16))


@exercise
def gather_kv(candidate):
    """Your gather returns a sequence's first context_len K rows in order, read through its block table."""

    def prop(case):
        num_blocks, block_size, table, context_len, seed = case
        pool = torch.randn(num_blocks, block_size, 3, generator=torch.Generator().manual_seed(seed))
        slots = [table[p // block_size] * block_size + p % block_size for p in range(context_len)]
        want = pool.view(-1, 3)[slots]
        desc = (f"a pool of {num_blocks} blocks of {block_size} tokens (vectors of 3), block_table={table}, "
                f"context_len={context_len}")
        got = call(candidate, pool.clone(), torch.tensor(table), context_len, case=desc)
        _close(got, want, desc, "the gathered rows", atol=0)

    forall(_gather_cases(), prop, examples=[(6, 4, [5, 1, 3], 10, 0)])


@st.composite
def _attention_cases(draw):
    num_keys = draw(st.integers(1, 24))
    cuts = sorted(draw(st.lists(st.integers(1, max(num_keys - 1, 1)), max_size=4, unique=True)))
    cuts = [c for c in cuts if c < num_keys]
    # a large score scale makes exp() overflow unless the running maximum is subtracted
    return num_keys, cuts, draw(st.integers(1, 3)), draw(st.sampled_from([1.0, 1000.0])), draw(st.integers(0, 2**16))


def _qkv(num_keys, rows, spread, seed, dim=4):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, dim, generator=g, dtype=torch.float64) * spread
    k, v = torch.randn(2, num_keys, dim, generator=g, dtype=torch.float64)
    return q, k, v


@exercise
def chunked_attention(candidate):
    """Your online softmax over key chunks equals softmax attention over all keys at once, even with huge scores."""

    def prop(case):
        num_keys, cuts, rows, spread, seed = case
        q, k, v = _qkv(num_keys, rows, spread, seed)
        scale = 1 / math.sqrt(q.shape[-1])
        want = torch.softmax(q @ k.T * scale, dim=-1) @ v
        bounds = [0, *cuts, num_keys]
        chunks = [(k[a:b], v[a:b]) for a, b in zip(bounds, bounds[1:])]
        desc = (f"{rows} quer{'y' if rows == 1 else 'ies'}, {num_keys} keys in chunks of {[b - a for a, b in zip(bounds, bounds[1:])]}, "
                f"q scaled by {spread:g} (random float64 q, k, v, torch seed {seed})")
        got = call(candidate, q.clone(), [(a.clone(), b.clone()) for a, b in chunks], scale, case=desc)
        _close(got, want, desc, "the attention output", atol=1e-6)

    forall(_attention_cases(), prop, examples=[(8, [3, 5], 1, 1000.0, 1), (8, [3, 5], 2, 1.0, 2)])


@exercise
def merge_attention(candidate):
    """Your merge of two partial results (output, log-sum-exp) equals attention over both key sets together."""

    def prop(case):
        num_keys, cuts, rows, spread, seed = case
        split = cuts[0] if cuts else num_keys  # the second part may be empty of keys: skip those cases
        if split >= num_keys:
            split = num_keys // 2
        if split == 0:
            return
        q, k, v = _qkv(num_keys, rows, spread, seed)
        scale = 1 / math.sqrt(q.shape[-1])
        want = torch.softmax(q @ k.T * scale, dim=-1) @ v
        parts = []
        for ks, vs in ((k[:split], v[:split]), (k[split:], v[split:])):
            s = q @ ks.T * scale
            parts.append((torch.softmax(s, -1) @ vs, torch.logsumexp(s, -1)))
        (o1, lse1), (o2, lse2) = parts
        desc = (f"{rows} quer{'y' if rows == 1 else 'ies'}; keys 0..{split - 1} in part 1, {split}..{num_keys - 1} in part 2; q scaled by "
                f"{spread:g} (log-sum-exp up to {max(lse1.max().item(), lse2.max().item()):.1f}; torch seed {seed})")
        got = call(candidate, o1.clone(), lse1.clone(), o2.clone(), lse2.clone(), case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, why=f"return (output, lse); got {type(got).__name__}")
        _close(got[0], want, desc, "the merged output", atol=1e-6)
        _close(got[1], torch.logsumexp(q @ k.T * scale, -1), desc, "the merged log-sum-exp", atol=1e-6)

    forall(_attention_cases(), prop, examples=[(8, [3], 2, 1000.0, 3), (8, [3], 2, 1.0, 4)])
