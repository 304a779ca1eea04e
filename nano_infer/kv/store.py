"""How attention writes a step's K/V into the paged pool and reads blocks back: one object per layer.

Attention (models/attention.py) never looks at how K/V is stored. It calls `write(slot_mapping, k, v)`
with the step's new tokens and `read(block_ids)` for the blocks a table names, and gets K and V back in
the model's dtype, one row per block ([n, block_size * kv_heads * head_dim]), in the basis the layer's
`rotation` names (None: the model's own; else attention turns its queries into that basis and its output
back). `write` returns the step's K/V as the cache will give them back, and attention uses those for the
step's own keys too: a token then sees the same keys whether they come from this step or from the cache, so
chunked prefill, a prefix-cache hit, recomputing after preemption and speculative verification give the
tokens they give without them, with 8-bit K/V as with full precision. An 8-bit store may also hold each
running sequence's open block exact (`open`, kv/open_blocks.py): a query then reads its own block from there,
a rule of positions too. Two ways to store them:

- `LayerKV` (kv_cache_dtype="auto"): the pool in the model's dtype. A write is one `index_copy_` into
  the layer's slots; a read is one `index_select` over the layer seen as blocks, which copies a few large
  rows (a whole block each) instead of one small row per token.
- `QuantizedLayerKV` ("int8", "fp8_e4m3", "fp8_e5m2"): each vector turned by `quant.rotation` (which spreads
  K's outlier channels over all of them, kv/quant.py says why), then the same two calls on 8-bit values plus
  the same two on their float16 scales (one per token and KV head), with `quant.quantize` before the write
  and `quant.dequantize` after the read. A token's bytes are final when written, so a read is still one gather
  and a multiply.

The views are made once per layer and reused by every step (and captured by CUDA graphs, whose
addresses must not move); nothing here waits on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .quant import canonical, dequantize, quantize, rotation, storage_dtype


@dataclass
class LayerKV:
    """One layer's K and V in the model's dtype: slots [num_slots, KVH, D] to write, blocks
    [num_blocks, block_size * KVH * D] to read."""

    k_slots: torch.Tensor
    v_slots: torch.Tensor
    k_blocks: torch.Tensor
    v_blocks: torch.Tensor
    rotation = None  # K/V are kept in the model's own basis

    @classmethod
    def of(cls, k_slots: torch.Tensor, v_slots: torch.Tensor, block_size: int) -> LayerKV:
        k_blocks = k_slots.view(-1, block_size * k_slots.shape[1:].numel())
        return cls(k_slots, v_slots, k_blocks, v_slots.view(k_blocks.shape))

    def write(self, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k_slots.index_copy_(0, slot_mapping, k)
        self.v_slots.index_copy_(0, slot_mapping, v)
        return k, v

    def read(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_blocks.index_select(0, block_ids), self.v_blocks.index_select(0, block_ids)


@dataclass
class QuantizedLayerKV:
    """One layer's K and V, each vector times `rotation` [D, D], as 8-bit values (`values`, a LayerKV over the int8
    container) and their float16 scales (`scales`, a LayerKV over [num_slots, KVH]); read back in `dtype`, the
    model's, still rotated."""

    values: LayerKV
    scales: LayerKV
    kv_cache_dtype: str
    dtype: torch.dtype
    rotation: torch.Tensor

    open: LayerKV | None = None  # exact open blocks (kv/open_blocks.py), rotated, in `dtype`

    def write(self, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # K and V stacked: one rotation, one quantize and one dequantize a layer instead of two of each
        return self.write_rotated(slot_mapping, torch.stack((k, v)) @ self.rotation)

    def write_rotated(self, slot_mapping: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`write` of K and V already turned by `rotation`, stacked [2, T, KVH, D]."""
        values, scales = quantize(kv, self.kv_cache_dtype)
        container = self.values.k_slots.dtype
        self.values.write(slot_mapping, values[0].view(container), values[1].view(container))
        self.scales.write(slot_mapping, scales[0], scales[1])
        back = dequantize(values, scales, self.dtype)
        return back[0], back[1]

    def write_open(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Exact rotated K and V [2, n, KVH, D] into open-block slots."""
        self.open.write(slots, kv[0], kv[1])

    def read_open(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact rotated K and V [*slots.shape, KVH, D] at open-block slots."""
        return tuple(t.index_select(0, slots.view(-1)).view(*slots.shape, *t.shape[1:])
                     for t in (self.open.k_slots, self.open.v_slots))

    def exact_chunks(self, chunks: list[tuple[slice, torch.Tensor]], write: tuple[torch.Tensor, torch.Tensor],
                     kv: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The step's rotated K/V `kv` [2, T, KVH, D]: for each prefill chunk (its rows, the open-block slots of the
        tokens before it in its first block) the exact K and V from its first block's start, read before the step
        writes; then the `write` rows go to their open-block slots, for later steps."""
        exact = []
        for rows, before in chunks:
            k, v = self.read_open(before)
            exact.append((torch.cat((k, kv[0, rows])), torch.cat((v, kv[1, rows]))))
        rows, slots = write
        self.write_open(slots, kv[:, rows])
        return exact

    def read(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, head_dim = block_ids.shape[0], self.values.k_slots.shape[-1]
        stored = storage_dtype(self.kv_cache_dtype)
        return tuple(dequantize(q.view(n, -1, head_dim).view(stored), s.view(n, -1), self.dtype).view(n, -1)
                     for q, s in zip(self.values.read(block_ids), self.scales.read(block_ids)))


@dataclass
class KVStore:
    """A pool's K/V as attention sees it: `tensor` [layers, 2, slots, KVH, D] (the model's dtype, or the int8
    container of 8-bit values) and, when quantized, `scales` [layers, 2, slots, KVH] in float16."""

    tensor: torch.Tensor
    scales: torch.Tensor | None = None
    kv_cache_dtype: str = "auto"
    dtype: torch.dtype | None = None  # what attention computes in; None: the tensor's own
    open: torch.Tensor | None = None  # 8-bit K/V: the exact open blocks [layers, 2, slots, KVH, D] (kv/open_blocks.py)

    def __post_init__(self):
        self.kv_cache_dtype = canonical(self.kv_cache_dtype)
        self.dtype = self.dtype or self.tensor.dtype

    def layers(self, block_size: int) -> list[LayerKV | QuantizedLayerKV]:
        """Per layer, the views attention writes and reads through, for blocks of `block_size` slots."""
        plain = [LayerKV.of(k, v, block_size) for k, v in self.tensor]
        if self.scales is None:
            return plain
        turn = rotation(self.tensor.shape[-1], self.dtype, self.tensor.device)  # one matrix, shared by every layer
        opened = [None] * len(plain) if self.open is None else [LayerKV.of(k, v, block_size) for k, v in self.open]
        return [QuantizedLayerKV(values, LayerKV.of(ks, vs, block_size), self.kv_cache_dtype, self.dtype, turn, o)
                for values, (ks, vs), o in zip(plain, self.scales, opened)]
