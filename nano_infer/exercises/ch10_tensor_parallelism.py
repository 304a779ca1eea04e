"""Chapter 10 exercises: a rank's rows of the fused q/k/v weight, the vocabulary-parallel embedding, bytes per token."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from ..core.utils import cdiv
from .core import call, exercise, expect, forall


@st.composite
def _head_layouts(draw):
    """(heads, kv_heads, world_size) that tensor parallelism accepts: tp divides the query heads, and tp
    and the KV heads divide one another (split or replicated KV heads)."""
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    group = draw(st.sampled_from([1, 2, 3]))
    heads = kv_heads * group
    sizes = [w for w in (1, 2, 4, 8) if heads % w == 0 and (kv_heads % w == 0 or w % kv_heads == 0)]
    return heads, kv_heads, draw(st.sampled_from(sizes)), draw(st.integers(0, 7))


def _reference_qkv_rows(heads, kv_heads, head_dim, rank, world_size) -> list[int]:
    nq = heads // world_size
    if kv_heads % world_size == 0:
        nk = kv_heads // world_size
        k0 = rank * nk
    else:
        nk, k0 = 1, rank // (world_size // kv_heads)
    q0 = rank * nq
    rows = list(range(q0 * head_dim, (q0 + nq) * head_dim))
    for base in (heads * head_dim, (heads + kv_heads) * head_dim):  # k rows, then v rows
        rows += range(base + k0 * head_dim, base + (k0 + nk) * head_dim)
    return rows


@exercise
def shard_qkv(candidate):
    """Your shard_qkv gives each rank its query heads and the K/V heads they read, split or replicated."""

    def prop(case):
        heads, kv_heads, world_size, rank_seed = case
        head_dim, hidden = 2, 3
        rank = rank_seed % world_size
        # row i of the fused weight is filled with i, so the rows that come back say which they are
        weight = torch.arange((heads + 2 * kv_heads) * head_dim, dtype=torch.float32)[:, None].repeat(1, hidden)
        desc = (f"heads={heads}, kv_heads={kv_heads}, head_dim={head_dim}, rank={rank}, world_size={world_size} "
                f"(row i of the fused weight holds the number i)")
        got = call(candidate, weight.clone(), heads, kv_heads, head_dim, rank, world_size, case=desc)
        want = _reference_qkv_rows(heads, kv_heads, head_dim, rank, world_size)
        expect(isinstance(got, torch.Tensor) and got.ndim == 2 and got.shape[1] == hidden, desc,
               f"a tensor [{len(want)}, {hidden}]", getattr(got, "shape", type(got).__name__),
               why="the shard keeps whole rows of the weight:")
        expect(got[:, 0].long().tolist() == want, desc, want, got[:, 0].long().tolist(),
               why="rows of the fused weight (q heads, then k heads, then v heads of this rank):")

    forall(_head_layouts(), prop, examples=[(8, 2, 4, 1), (8, 2, 2, 1), (4, 4, 2, 1)])


@st.composite
def _vocab_cases(draw):
    vocab = draw(st.integers(2, 40))
    world_size = draw(st.integers(1, 5))
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12))
    return vocab, world_size, ids, draw(st.integers(0, 2**16))


@exercise
def vocab_parallel_embedding(candidate):
    """Your ranks' embeddings add up to the full table's rows: each rank gives its own rows and zeros elsewhere."""

    def prop(case):
        vocab, world_size, ids, seed = case
        hidden = 3
        table = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed))
        rows = cdiv(vocab, world_size)
        padded = torch.cat([table, table.new_zeros(rows * world_size - vocab, hidden)])
        total = torch.zeros(len(ids), hidden)
        for rank in range(world_size):
            desc = (f"vocab={vocab} split over {world_size} ranks ({rows} rows each, the last padded with zeros), "
                    f"rank={rank}, input_ids={ids}")
            got = call(candidate, torch.tensor(ids), padded[rank * rows : (rank + 1) * rows].clone(), rank, case=desc)
            mine = [rank * rows <= t < (rank + 1) * rows for t in ids]
            want = torch.where(torch.tensor(mine)[:, None], table[torch.tensor(ids)], 0.0)
            expect(isinstance(got, torch.Tensor) and tuple(got.shape) == (len(ids), hidden), desc,
                   (len(ids), hidden), getattr(got, "shape", type(got).__name__), why="shape of this rank's output:")
            expect(torch.allclose(got, want), desc, want.tolist(), got.tolist(),
                   why="this rank's rows of the embedding for the tokens it holds, zeros for the others:")
            total += got
        expect(torch.allclose(total, table[torch.tensor(ids)]), f"vocab={vocab}, {world_size} ranks, input_ids={ids}",
               table[torch.tensor(ids)].tolist(), total.tolist(), why="the all-reduce (sum over ranks):")

    forall(_vocab_cases(), prop, examples=[(10, 3, [0, 3, 4, 9], 0)])


def _bytes_per_token(hidden, layers, dtype_bytes, world_size):
    if world_size == 1:
        return 0.0
    message = hidden * dtype_bytes
    return (2 * layers + 1) * 2 * (world_size - 1) / world_size * message


@exercise
def allreduce_bytes_per_token(candidate):
    """Your count of the bytes each rank sends per token matches a ring all-reduce of every layer's two sums."""
    cases = [(4096, 32, 2, 2), (8192, 80, 2, 8), (256, 5, 4, 2), (896, 24, 2, 4), (64, 2, 4, 1), (5120, 64, 2, 3)]
    for hidden, layers, dtype_bytes, world_size in cases:
        desc = f"hidden_size={hidden}, num_layers={layers}, dtype_bytes={dtype_bytes}, world_size={world_size}"
        got = call(candidate, hidden, layers, dtype_bytes, world_size, case=desc)
        want = _bytes_per_token(hidden, layers, dtype_bytes, world_size)
        expect(isinstance(got, (int, float)) and abs(got - want) <= 1e-6 * max(want, 1), desc, want, got,
               why="bytes one rank sends per token, one forward pass:")
