"""Attention over a packed step, in plain torch ops (no Triton, no custom kernels).

One engine step packs the new tokens of many sequences into one tensor. Each sequence
contributes `q_len` query tokens (a prefill chunk, or 1 for a decode) and attends over
its `context_len` keys: the ones already in the KV cache plus its own new ones.

Three ways to read the keys:
- `dense`: no cache at all (stage 00). Keys are the step's own tokens.
- `gather` (stage 02/06): copy each sequence's K/V out of the paged pool through its block
  table into a contiguous tensor, then one `scaled_dot_product_attention`.
- `blockwise` (stage 06): walk the block table a few blocks at a time and merge partial
  results with an online softmax, so a sequence's whole K/V never exists in one tensor.

Grouped-query attention is handled by folding the query heads that share a KV head into
the query-length axis: q [G*q_len] rows against k [ctx] columns, so K/V are never repeated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class SeqSlice:
    """Where one sequence's queries sit in the packed step and where its keys are."""

    q_start: int
    q_len: int
    context_len: int  # keys visible to the last query = tokens cached + q_len
    key_slots: torch.Tensor | None = None  # [context_len] slot ids into the pool (None for dense)


@dataclass
class DecodeBatch:
    """Decodes attended in one call: B sequences of similar context length, padded to the longest of them."""

    rows: torch.Tensor  # [B] positions in the packed step of the 1-token queries
    slots: torch.Tensor  # [B, S] key slots, padded to the longest context in this batch
    mask: torch.Tensor  # [B, 1, 1, S] True where a key is visible


@dataclass
class AttentionMetadata:
    """Everything the attention of one step needs; built once, shared by all layers."""

    slot_mapping: torch.Tensor | None  # [T] where each new token's K/V is written (None: no cache)
    prefills: list[SeqSlice] = field(default_factory=list)  # sequences with q_len > 1, one SDPA each
    decodes: list[DecodeBatch] = field(default_factory=list)  # 1-token queries, batched by context length
    block_size: int = 16


def fold_gqa(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[..., L, H, D] -> [..., KVH, G*L, D]: the G query heads of each KV head stacked on the L axis."""
    *lead, L, H, D = q.shape
    G = H // num_kv_heads
    q = q.reshape(*lead, L, num_kv_heads, G, D).movedim(-4, -2)  # [..., KVH, G, L, D]
    return q.reshape(*lead, num_kv_heads, G * L, D)


def unfold_gqa(o: torch.Tensor, L: int) -> torch.Tensor:
    """Inverse of fold_gqa: [..., KVH, G*L, D] -> [..., L, H, D]."""
    *lead, KVH, GL, D = o.shape
    o = o.reshape(*lead, KVH, GL // L, L, D).movedim(-2, -4)  # [..., L, KVH, G, D]
    return o.reshape(*lead, L, KVH * (GL // L), D)


def causal_mask(q_len: int, context_len: int, groups: int, device) -> torch.Tensor:
    """[G*q_len, context_len] bool: query i (at absolute position context_len - q_len + i) sees keys <= its position."""
    q_pos = torch.arange(context_len - q_len, context_len, device=device)
    mask = torch.arange(context_len, device=device)[None, :] <= q_pos[:, None]
    return mask.repeat(groups, 1)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [.., KVH, M, D], k/v [.., KVH, S, D], mask broadcastable to [.., KVH, M, S] (True = visible)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def online_softmax_attention(q, k_chunks, scale: float):
    """Attention computed one key chunk at a time, FlashAttention-style.

    `k_chunks` yields (k [.., S_c, D], v [.., S_c, D], mask [.., M, S_c]). Keeps a running max `m`,
    running denominator `l` and un-normalised output `acc`; each new chunk rescales the old ones
    by exp(m_old - m_new), so the result equals softmax over all keys at once.
    """
    m = l = acc = None
    for k, v, mask in k_chunks:
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        chunk_max = s.amax(dim=-1, keepdim=True)
        m_new = chunk_max if m is None else torch.maximum(m, chunk_max)
        p = torch.exp(s - m_new)
        if m is None:
            l, acc = p.sum(-1, keepdim=True), torch.matmul(p, v)
        else:
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + torch.matmul(p, v)
        m = m_new
    return acc / l


class AttentionBackend:
    """Writes the step's K/V into the cache (if any) and computes attention for one layer.

    `kv_cache` is [num_layers, 2, num_slots, num_kv_heads, head_dim] or None. A slot is one
    token's K (or V) vector; slot = block_id * block_size + offset.
    """

    def __init__(self, impl: str, kv_cache: torch.Tensor | None, blocks_per_chunk: int = 16):
        if impl not in ("dense", "gather", "blockwise"):
            raise ValueError(f"attention={impl!r} is invalid: use 'gather' or 'blockwise'")
        self.impl = impl
        self.kv_cache = kv_cache
        self.blocks_per_chunk = blocks_per_chunk
        self.meta: AttentionMetadata | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        num_kv_heads = k.shape[1]
        if self.kv_cache is not None:
            k_pool, v_pool = self.kv_cache[layer, 0], self.kv_cache[layer, 1]
            k_pool.index_copy_(0, meta.slot_mapping, k)
            v_pool.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        groups = q.shape[1] // num_kv_heads
        for s in meta.prefills:
            qs = fold_gqa(q[s.q_start : s.q_start + s.q_len], num_kv_heads)  # [KVH, G*L, D]
            if self.kv_cache is None:  # dense: the chunk is the whole sequence
                ks, vs = k[s.q_start : s.q_start + s.q_len], v[s.q_start : s.q_start + s.q_len]
                o = sdpa(qs, ks.transpose(0, 1), vs.transpose(0, 1), causal_mask(s.q_len, s.context_len, groups, q.device))
            elif self.impl == "blockwise":
                o = self._blockwise(qs, k_pool, v_pool, s.key_slots[None], torch.tensor([s.context_len], device=q.device), s.q_len, groups)[0]
            else:
                ks, vs = k_pool.index_select(0, s.key_slots), v_pool.index_select(0, s.key_slots)
                o = sdpa(qs, ks.transpose(0, 1), vs.transpose(0, 1), causal_mask(s.q_len, s.context_len, groups, q.device))
            out[s.q_start : s.q_start + s.q_len] = unfold_gqa(o, s.q_len)
        for d in meta.decodes:
            qd = fold_gqa(q[d.rows].unsqueeze(1), num_kv_heads)  # [B, KVH, G, D]
            if self.impl == "blockwise":
                o = self._blockwise(qd, k_pool, v_pool, d.slots, d.mask.sum(-1).view(-1), 1, groups)
            else:
                B, S = d.slots.shape
                flat = d.slots.reshape(-1)
                kd = k_pool.index_select(0, flat).view(B, S, num_kv_heads, -1).transpose(1, 2)
                vd = v_pool.index_select(0, flat).view(B, S, num_kv_heads, -1).transpose(1, 2)
                o = sdpa(qd, kd, vd, d.mask)
            out[d.rows] = unfold_gqa(o, 1).squeeze(1)
        return out

    def _blockwise(self, q, k_pool, v_pool, slots, context_lens, q_len, groups):
        """q [B, KVH, G*q_len, D]; slots [B, S]; walks S in chunks of `blocks_per_chunk` blocks."""
        B, S = slots.shape
        chunk = self.blocks_per_chunk * self.meta.block_size
        scale = 1.0 / math.sqrt(q.shape[-1])
        # absolute position of each query row (same for every group), per sequence: [B, G*q_len, 1]
        q_pos = (context_lens.view(B, 1) - q_len + torch.arange(q_len, device=q.device).view(1, q_len)).repeat(1, groups).unsqueeze(-1)

        def chunks():
            for start in range(0, S, chunk):
                idx = slots[:, start : start + chunk]
                n = idx.shape[1]
                kc = k_pool.index_select(0, idx.reshape(-1)).view(B, n, k_pool.shape[1], -1).transpose(1, 2)
                vc = v_pool.index_select(0, idx.reshape(-1)).view(B, n, v_pool.shape[1], -1).transpose(1, 2)
                key_pos = torch.arange(start, start + n, device=q.device).view(1, 1, n)
                yield kc, vc, (key_pos <= q_pos).unsqueeze(1)  # [B, 1, G*q_len, n]

        return online_softmax_attention(q, chunks(), scale)
