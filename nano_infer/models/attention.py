"""Attention over a packed step, in plain torch ops (no Triton, no custom kernels).

One engine step packs the new tokens of many sequences into one tensor. Each sequence
contributes `q_len` query tokens (a prefill chunk, or 1 for a decode) and attends over
its `context_len` keys: the ones already in the KV cache plus its own new ones.

Three ways to read the keys:
- `dense`: no cache at all (chapter 00). Keys are the step's own tokens.
- `gather` (chapters 02/06): copy each sequence's K/V out of the paged pool through its block
  table into a contiguous tensor, then one `scaled_dot_product_attention`. A prompt with
  nothing cached before it needs no pool read and no mask: see `causal_prompt_attention`.
- `blockwise` (chapter 06): walk the block table a few blocks at a time and merge partial
  results with an online softmax, so a sequence's whole K/V never exists in one tensor.

With an 8-bit pool's exact open blocks (kv/open_blocks.py) a query reads earlier blocks rounded from the pool and
its own block exact: the exact keys follow the pool's, and the mask picks which copy each query sees.

Grouped-query attention is handled by folding the query heads that share a KV head into
the query-length axis: q [G*q_len] rows against k [ctx] columns, so K/V are never repeated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..kv.open_blocks import open_block_visible
from ..kv.store import KVStore


@dataclass
class SeqSlice:
    """One sequence with several query tokens in the step (a prompt, or a chunk of one)."""

    q_start: int
    q_len: int
    context_len: int  # keys visible to the last query = tokens cached + q_len
    block_table: torch.Tensor | None = None  # [ceil(context_len / block_size)] block ids (None for dense)
    mask: torch.Tensor | None = None  # additive causal mask [G*q_len, context_len]: built by the first layer, reused
    open_slots: torch.Tensor | None = None  # open-block slots of the tokens before it in its first block (8-bit K/V)


@dataclass
class DecodeBatch:
    """Decodes attended in one call: rows [start, end) of the packed step, `q_len` query tokens per
    sequence (1 for a decode, 1 + proposals for a speculative verify), sequences of similar
    context length, padded to the longest of them."""

    start: int
    end: int
    block_tables: torch.Tensor  # [B, ceil(longest context / block_size)] block ids, padded with block 0
    context_lens: torch.Tensor  # [B]
    mask: torch.Tensor  # [B, 1, q_len, max_blocks * block_size] additive: 0 for a visible key, -inf past the query's position
    q_len: int = 1
    # 8-bit K/V: [B, n * block_size] open-block slots of the n blocks the queries sit in; the mask then covers
    # the pool's keys and these after them
    open_slots: torch.Tensor | None = None


@dataclass
class AttentionMetadata:
    """Everything the attention of one step needs; built once, shared by all layers."""

    slot_mapping: torch.Tensor | None  # [T] where each new token's K/V is written (None: no cache)
    prefills: list[SeqSlice] = field(default_factory=list)  # sequences with q_len > 1, one SDPA each
    decodes: list[DecodeBatch] = field(default_factory=list)  # 1-token queries, batched by context length
    block_size: int = 16
    open_write: tuple[torch.Tensor, torch.Tensor] | None = None  # 8-bit K/V: (rows, open-block slots) to write


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
    """q [B, KVH, M, D], k/v [B, KVH, S, D], mask broadcastable to [B, KVH, M, S] (True or 0 = visible).

    Always 4-D: PyTorch's fused CPU kernel takes only 4-D inputs, and a 3-D call falls back to the
    unfused math path, several times slower on a prompt (the README's CPU-path list has the timings)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def causal_prompt_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A prompt (or first chunk) with nothing cached before it: q [L, H, D] over its own k/v [L, KVH, D].

    No mask to build ([G*L, L] floats, growing with the square of the prompt) and the fused kernel skips
    the key blocks above the diagonal, about half of the work, which it computes when given a mask."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, enable_gqa=True)
    return o[0].transpose(0, 1)


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
        # a row that has seen no key yet (an exact open block's query, before its own block) subtracts 0
        m_safe = m_new.masked_fill(m_new == float("-inf"), 0)
        p = torch.exp(s - m_safe)
        if m is None:
            l, acc = p.sum(-1, keepdim=True), torch.matmul(p, v)
        else:
            alpha = torch.exp(m - m_safe)
            l = l * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + torch.matmul(p, v)
        m = m_new
    return acc / l


class AttentionBackend:
    """Writes the step's K/V into the cache (if any) and computes attention for one layer.

    `kv` is the paged pool (a `KVStore`, or its tensor [num_layers, 2, num_slots, num_kv_heads,
    head_dim] in the model's dtype) or None. A slot is one token's K (or V) vector; slot = block_id
    * block_size + offset. How K/V is stored (the model's dtype, or 8 bits with scales) is the store's
    business: each layer's `write` puts the step's K/V at the slot mapping, and `read` returns the
    blocks of a table, one row of block_size * kv_heads * head_dim per block, in the model's dtype.
    Each subclass is one way to attend: `prefill` for a prompt chunk, `decode` for a batch of decode
    (or verify) rows.
    """

    def __init__(self, kv: KVStore | torch.Tensor | None, blocks_per_chunk: int = 16):
        self.store = KVStore(kv) if isinstance(kv, torch.Tensor) else kv
        self.blocks_per_chunk = blocks_per_chunk
        self.meta: AttentionMetadata | None = None
        self._views: tuple[int, list] | None = None  # (block_size, per layer: its LayerKV)

    @property
    def kv_cache(self) -> torch.Tensor | None:
        """The pool's tensor [num_layers, 2, num_slots, num_kv_heads, head_dim] (None: no cache)."""
        return None if self.store is None else self.store.tensor

    def layer_kv(self, layer: int, block_size: int):
        """The layer's write and read views, made once: indexing the 5-D pool anew in every layer of every
        step is ten aten calls a layer."""
        if self._views is None or self._views[0] != block_size:
            self._views = block_size, self.store.layers(block_size)
        return self._views[1][layer]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        kv = None
        if self.store is not None:
            kv = self.layer_kv(layer, meta.block_size)
            if kv.rotation is not None:  # 8-bit K/V are kept rotated (kv/quant.py): q into that basis, the output back
                turned = torch.stack((k, v)) @ kv.rotation
                k, v = kv.write_rotated(meta.slot_mapping, turned)  # as the cache gives them back: dequantized
                exact = None if meta.open_write is None else kv.exact_chunks(
                    [(slice(s.q_start, s.q_start + s.q_len), s.open_slots) for s in meta.prefills], meta.open_write, turned)
                return self._attend(meta, q @ kv.rotation, k, v, kv, exact) @ kv.rotation.T
            k, v = kv.write(meta.slot_mapping, k, v)
        return self._attend(meta, q, k, v, kv)

    def _attend(self, meta: AttentionMetadata, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv,
                exact: list | None = None) -> torch.Tensor:
        if not meta.prefills and len(meta.decodes) == 1:  # a decode-only step: no output buffer to fill
            return self._decode_rows(meta.decodes[0], q, k.shape[1], kv)
        out = torch.empty_like(q)
        for i, s in enumerate(meta.prefills):
            rows = slice(s.q_start, s.q_start + s.q_len)
            out[rows] = self.prefill(s, q[rows], k[rows], v[rows], kv, None if exact is None else exact[i])
        for d in meta.decodes:
            out[d.start : d.end] = self._decode_rows(d, q[d.start : d.end], k.shape[1], kv)
        return out

    def _decode_rows(self, d: DecodeBatch, q: torch.Tensor, kv_heads: int, kv) -> torch.Tensor:
        """q [B * q_len, H, D], the rows of one decode batch -> their attention output, same shape. For one
        query token a sequence, folding the groups is a view: [B, H, D] is [B, KVH, G, D]."""
        B, (H, D) = q.shape[0] // d.q_len, q.shape[1:]
        if d.q_len == 1:
            return self.decode(d, q.view(B, kv_heads, H // kv_heads, D), kv, H // kv_heads).reshape(B, H, D)
        o = self.decode(d, fold_gqa(q.view(B, d.q_len, H, D), kv_heads), kv, H // kv_heads)
        return unfold_gqa(o, d.q_len).reshape(q.shape)

    def prefill(self, s: SeqSlice, q, k, v, kv, exact=None) -> torch.Tensor:
        """q, k, v [L, heads, D] of one prompt chunk; returns its attention output [L, heads, D]. `kv`: the
        layer's store (`kv.read(block_table)`), None without a cache. `exact`: with an 8-bit pool's open
        blocks, the exact (K, V) [E, KVH, D] of positions [context_len - E, context_len), from its first block's start."""
        raise NotImplementedError

    def decode(self, d: DecodeBatch, q, kv, groups: int) -> torch.Tensor:
        """q [B, KVH, G*q_len, D]; returns the output in the same layout."""
        raise NotImplementedError


class DenseAttention(AttentionBackend):
    """No KV cache: every step recomputes the whole sequence, so a prompt attends to its own K/V."""

    def prefill(self, s, q, k, v, kv, exact=None):
        return causal_prompt_attention(q, k, v)


class GatherAttention(AttentionBackend):
    """Gather each sequence's keys and values through its block table into one tensor, then SDPA."""

    def prefill(self, s, q, k, v, kv, exact=None):
        if s.context_len == s.q_len and exact is None:  # nothing cached before: its own K/V
            return causal_prompt_attention(q, k, v)
        groups = q.shape[1] // k.shape[1]
        if s.mask is None or s.mask.shape[0] != groups * s.q_len:  # built by the first layer, reused
            pos = torch.arange(s.context_len, device=q.device)  # with exact open blocks: those after the pool's
            visible = causal_mask(s.q_len, s.context_len, groups, q.device) if exact is None else open_block_visible(
                pos[-s.q_len :, None], pos[None], pos[None, -len(exact[0]) :], self.meta.block_size).repeat(groups, 1)
            s.mask = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill_(~visible, float("-inf"))
        # a chunk after cached tokens: keys from the pool (and the exact open block after them), an explicit mask
        ks, vs = (b.view(-1, *k.shape[1:])[: s.context_len] for b in kv.read(s.block_table))
        ks, vs = (ks, vs) if exact is None else (torch.cat((ks, exact[0])), torch.cat((vs, exact[1])))
        o = sdpa(fold_gqa(q, k.shape[1])[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None], s.mask)[0]
        return unfold_gqa(o, s.q_len)

    def decode(self, d, q, kv, groups):
        B, kv_heads, D = q.shape[0], q.shape[1], q.shape[-1]
        kd, vd = (b.view(B, -1, kv_heads, D) for b in kv.read(d.block_tables.view(-1)))  # [B, S, KVH, D]
        if d.open_slots is not None:  # the exact open blocks after the pool's keys
            kd, vd = (torch.cat(pair, 1) for pair in zip((kd, vd), kv.read_open(d.open_slots)))
        mask = d.mask if d.q_len == 1 else d.mask.repeat(1, 1, groups, 1)  # rows are (group, query)
        return sdpa(q, kd.transpose(1, 2), vd.transpose(1, 2), mask)


class BlockwiseAttention(AttentionBackend):
    """Walk the block table `blocks_per_chunk` blocks at a time with an online softmax: no tensor
    ever holds a whole sequence's keys (FlashAttention's loop, in torch ops)."""

    def prefill(self, s, q, k, v, kv, exact=None):
        context_lens = torch.tensor([s.context_len], device=q.device)
        qs = fold_gqa(q, k.shape[1])[None]  # [1, KVH, G*L, D]
        if exact is not None:
            exact = tuple(e.transpose(0, 1)[None] for e in exact)  # [1, KVH, E, D]
        o = self._blockwise(qs, kv, s.block_table[None], context_lens, s.q_len, q.shape[1] // k.shape[1], exact)[0]
        return unfold_gqa(o, s.q_len)

    def decode(self, d, q, kv, groups):
        exact = None if d.open_slots is None else tuple(e.transpose(1, 2) for e in kv.read_open(d.open_slots))
        return self._blockwise(q, kv, d.block_tables, d.context_lens, d.q_len, groups, exact)

    def _blockwise(self, q, kv, block_tables, context_lens, q_len, groups, exact=None):
        """q [B, KVH, G*q_len, D]; block_tables [B, n]; walks the tables `blocks_per_chunk` blocks at a time, then
        `exact`, an 8-bit pool's exact open blocks (K, V) [B, KVH, E, D] from the first query's block on."""
        B = block_tables.shape[0]
        bs = self.meta.block_size
        scale = 1.0 / math.sqrt(q.shape[-1])
        # absolute position of each query row (same for every group), per sequence: [B, G*q_len, 1]
        q_pos = (context_lens.view(B, 1) - q_len + torch.arange(q_len, device=q.device).view(1, q_len)).repeat(1, groups).unsqueeze(-1)
        S = block_tables.shape[1] * bs
        visible = None if exact is None else open_block_visible(  # the pool's keys, then the exact open blocks'
            q_pos, torch.arange(S, device=q.device).view(1, 1, S),  # (from the first query's block on)
            ((context_lens - q_len) // bs * bs).view(B, 1, 1) + torch.arange(exact[0].shape[2], device=q.device), bs)

        def chunks():
            for first in range(0, block_tables.shape[1], self.blocks_per_chunk):
                table = block_tables[:, first : first + self.blocks_per_chunk]
                kc, vc = (b.view(B, -1, q.shape[1], q.shape[-1]).transpose(1, 2)
                          for b in kv.read(table.reshape(-1)))  # [B, KVH, n, D]
                n = kc.shape[2]
                key_pos = torch.arange(first * bs, first * bs + n, device=q.device).view(1, 1, n)
                mask = key_pos <= q_pos if visible is None else visible[..., first * bs : first * bs + n]
                yield kc, vc, mask.unsqueeze(1)  # [B, 1, G*q_len, n]
            if exact is not None:
                yield *exact, visible[..., S:].unsqueeze(1)

        return online_softmax_attention(q, chunks(), scale)


BACKENDS = {"dense": DenseAttention, "gather": GatherAttention, "blockwise": BlockwiseAttention}


def make_backend(impl: str, kv: KVStore | torch.Tensor | None, blocks_per_chunk: int = 16) -> AttentionBackend:
    """The backend named by `LLM(attention=...)` ("dense" when there is no KV cache)."""
    if impl not in BACKENDS:
        raise ValueError(f"attention={impl!r} is invalid: use 'gather' or 'blockwise'")
    return BACKENDS[impl](kv, blocks_per_chunk)
