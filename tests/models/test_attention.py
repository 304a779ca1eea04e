"""Paged attention (gather and blockwise) against plain dense attention, on random packed steps.

Each case builds a KV pool by hand: every sequence gets randomly chosen blocks, its cached
K/V is written at `block * block_size + offset`, and the step's new tokens (prefill chunks
of any length and single decode tokens, interleaved in one packed batch) come in as q/k/v.
The reference is float64 softmax attention per sequence over its full K/V with the causal
mask at absolute positions, with K/V repeated per query head (no GQA folding), so it
shares no code with nano_infer.models.attention.

Tolerance: inputs are N(0, 1) in float32; outputs must match the float64 reference within
atol 2e-5 + rtol 1e-4 (float32 rounding over a few hundred keys is ~1e-6).
"""
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nano_infer.models.attention import AttentionMetadata, DecodeBatch, SeqSlice, make_backend

ATOL, RTOL = 2e-5, 1e-4
IMPLS = ["gather", "blockwise"]


def build_step(seqs, num_kv_heads, groups, head_dim, block_size, num_layers=2, layer=1, seed=0):
    """seqs: list of (num_cached, q_len). Returns (pool, meta, q, k, v, reference output)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    num_heads = num_kv_heads * groups
    blocks_needed = [math.ceil((c + n) / block_size) for c, n in seqs]
    num_blocks = sum(blocks_needed) + 2  # spare blocks stay random garbage: reading them would show
    pool = torch.randn(num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim, generator=gen)
    free = list(range(num_blocks))
    rng.shuffle(free)
    # The packed batch: prefill chunks in random order, with the decodes as one run of rows somewhere
    # among them (each decode batch is a contiguous range of rows), in random order of length.
    prefill_ids = [i for i, (_, n) in enumerate(seqs) if n > 1]
    decode_ids = [i for i, (_, n) in enumerate(seqs) if n == 1]
    rng.shuffle(prefill_ids)
    rng.shuffle(decode_ids)
    cut = rng.randint(0, len(prefill_ids))
    order = prefill_ids[:cut] + decode_ids + prefill_ids[cut:]
    q_parts, k_parts, v_parts, slot_mapping, prefills, decodes = [], [], [], [], [], []
    refs, q_start = {}, 0
    for i in order:
        cached, q_len = seqs[i]
        ctx = cached + q_len
        table = [free.pop() for _ in range(blocks_needed[i])]
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(ctx)])
        k_all = torch.randn(ctx, num_kv_heads, head_dim, generator=gen)
        v_all = torch.randn(ctx, num_kv_heads, head_dim, generator=gen)
        q = torch.randn(q_len, num_heads, head_dim, generator=gen)
        pool[layer, 0, slots[:cached]] = k_all[:cached]
        pool[layer, 1, slots[:cached]] = v_all[:cached]
        q_parts.append(q)
        k_parts.append(k_all[cached:])
        v_parts.append(v_all[cached:])
        slot_mapping.append(slots[cached:])
        if q_len == 1:
            decodes.append((q_start, table, ctx))
        else:
            prefills.append(SeqSlice(q_start, q_len, ctx, torch.tensor(table)))
        refs[i] = (q_start, reference(q, k_all, v_all, cached))
        q_start += q_len
    meta = AttentionMetadata(slot_mapping=torch.cat(slot_mapping), prefills=prefills, block_size=block_size)
    size = rng.randint(1, max(1, len(decodes)))  # decodes go in one or several batches, each padded on its own
    for start in range(0, len(decodes), size):
        batch = decodes[start : start + size]
        width = max(len(table) for _, table, _ in batch)
        # padding points at block 0, which belongs to some sequence (or is garbage): the mask must hide it
        tables = torch.tensor([table + [0] * (width - len(table)) for _, table, _ in batch])
        lens = torch.tensor([ctx for _, _, ctx in batch])
        hidden = torch.arange(width * block_size)[None, :] >= lens[:, None]
        mask = torch.zeros(hidden.shape).masked_fill(hidden, float("-inf")).view(len(batch), 1, 1, -1)
        meta.decodes.append(DecodeBatch(batch[0][0], batch[0][0] + len(batch), tables, lens, mask))
    q, k, v = torch.cat(q_parts), torch.cat(k_parts), torch.cat(v_parts)
    expected = torch.empty(q.shape, dtype=torch.float64)
    for q_start_i, out in refs.values():
        expected[q_start_i : q_start_i + out.shape[0]] = out
    return pool, meta, q, k, v, expected


def reference(q, k, v, cached):
    """float64 softmax attention; query i sits at absolute position cached + i."""
    q_len, num_heads, head_dim = q.shape
    groups = num_heads // k.shape[1]
    k = k.double().repeat_interleave(groups, dim=1)  # [ctx, H, D]
    v = v.double().repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(head_dim)
    q_pos = torch.arange(cached, cached + q_len)[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run(impl, seqs, num_kv_heads, groups, head_dim, block_size, blocks_per_chunk=16, seed=0, layer=1):
    pool, meta, q, k, v, expected = build_step(seqs, num_kv_heads, groups, head_dim, block_size, layer=layer, seed=seed)
    backend = make_backend(impl, pool, blocks_per_chunk=blocks_per_chunk)
    backend.meta = meta
    out = backend.attend(layer, q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=RTOL)
    # the step's own K/V landed in the pool at the slot mapping
    torch.testing.assert_close(pool[layer, 0, meta.slot_mapping], k)
    torch.testing.assert_close(pool[layer, 1, meta.slot_mapping], v)
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", [
    dict(seqs=[(0, 1)]),  # the very first token, alone
    dict(seqs=[(0, 7)]),  # a whole prompt in one chunk
    dict(seqs=[(37, 1)]),  # one decode
    dict(seqs=[(12, 5)]),  # a later chunk of a prompt
    dict(seqs=[(0, 9), (20, 1), (16, 16), (3, 1), (100, 1), (31, 3)]),  # mixed step
    dict(seqs=[(15, 1), (16, 1), (17, 1)], block_size=16),  # contexts around a block boundary
    dict(seqs=[(5, 1), (200, 1)], block_size=4, blocks_per_chunk=3),  # decodes of very different lengths
    dict(seqs=[(45, 6), (0, 50)], block_size=4, blocks_per_chunk=2),  # prefills spanning many chunks
])
def test_matches_dense_reference(impl, case):
    case = dict(case)
    run(impl, case.pop("seqs"), num_kv_heads=2, groups=3, head_dim=16,
        block_size=case.pop("block_size", 8), blocks_per_chunk=case.pop("blocks_per_chunk", 16))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("num_kv_heads,groups", [(1, 1), (4, 1), (1, 8), (2, 7)])  # MHA, GQA, MQA
def test_gqa_ratios(impl, num_kv_heads, groups):
    run(impl, [(10, 1), (0, 6), (25, 4), (3, 1)], num_kv_heads, groups, head_dim=8, block_size=4, blocks_per_chunk=2)


@pytest.mark.parametrize("impl", IMPLS)
def test_layer_zero_and_block_size_one(impl):
    run(impl, [(6, 1), (0, 4), (9, 2)], num_kv_heads=2, groups=2, head_dim=4, block_size=1, blocks_per_chunk=3, layer=0)


@st.composite
def steps(draw):
    seqs = draw(st.lists(
        st.one_of(
            st.tuples(st.integers(0, 120), st.just(1)),  # decode
            st.tuples(st.integers(0, 80), st.integers(2, 40)),  # prefill chunk (from 0 or after a cached prefix)
        ), min_size=1, max_size=6))
    return dict(
        seqs=seqs,
        num_kv_heads=draw(st.sampled_from([1, 2, 3])),
        groups=draw(st.sampled_from([1, 2, 4, 5])),
        head_dim=draw(st.sampled_from([4, 8, 32, 64])),
        block_size=draw(st.sampled_from([1, 2, 5, 16, 32])),
        blocks_per_chunk=draw(st.sampled_from([1, 2, 16])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None)
@given(case=steps())
def test_random_packed_steps(case):
    outs = [run(impl, **case) for impl in IMPLS]
    torch.testing.assert_close(outs[0], outs[1], atol=ATOL, rtol=RTOL)


def test_rejects_unknown_impl():
    with pytest.raises(ValueError, match="attention="):
        make_backend("flash", None)


@pytest.mark.parametrize("impl", IMPLS)
def test_builds_nothing_off_the_model_device(impl):
    """On a GPU every index and mask must live on the GPU. The meta device catches a stray CPU tensor without one."""
    dev = torch.device("meta")
    pool = torch.empty(1, 2, 64, 2, 8, device=dev)
    meta = AttentionMetadata(slot_mapping=torch.arange(5, 11, device=dev),
                             prefills=[SeqSlice(0, 5, 10, torch.arange(3, device=dev))], block_size=4)
    meta.decodes = [DecodeBatch(5, 6, torch.arange(5, 9, device=dev).view(1, 4), torch.tensor([13], device=dev),
                                torch.zeros(1, 1, 1, 16, device=dev))]
    backend = make_backend(impl, pool, blocks_per_chunk=2)
    backend.meta = meta
    out = backend.attend(0, torch.empty(6, 4, 8, device=dev), torch.empty(6, 2, 8, device=dev), torch.empty(6, 2, 8, device=dev))
    assert out.shape == (6, 4, 8) and out.device == dev


def test_prompts_and_cached_chunks_in_one_step():
    """Fresh prompts (the causal kernel, K/V from the step) and chunks after cached tokens (the pool, a mask)
    side by side, with GQA: both paths must give the reference."""
    run("gather", [(0, 9), (20, 1), (16, 16), (31, 3), (0, 40)], num_kv_heads=2, groups=3, head_dim=16, block_size=8)