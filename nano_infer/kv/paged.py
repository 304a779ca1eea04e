"""The KV pool: one tensor, allocated once, that every sequence's K/V lives in.

Shape [num_layers, 2 (K and V), num_blocks * block_size, num_kv_heads, head_dim]. A new
token's K/V goes to its slot (`block_id * block_size + offset`, the slot mapping);
attention reads a sequence's keys through its block table. The pool is sized from a
byte budget, so "how many tokens fit" is a number you can compute before serving.

With `kv_cache_dtype` "int8" or "fp8" (chapter 14) the tensor holds one byte a value and a second
one, `scales` [num_layers, 2, num_slots, num_kv_heads] in float16, one scale per slot and head
(kv/quant.py says why per token); `store` is what attention writes and reads through either way.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import torch

from .quant import CONTAINER_DTYPE, SCALE_DTYPE, is_quantized
from .store import KVStore


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K and V, every layer: layers x 2 x kv_heads x head_dim x bytes per element."""
    return num_layers * 2 * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


@dataclass
class KVPool:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # the model's: what attention computes in, and what "auto" stores
    device: torch.device
    kv_cache_dtype: str = "auto"
    open_rows: int = 0  # 8-bit K/V: rows of exact open blocks (kv/open_blocks.py), `open_ring` blocks each
    open_ring: int = 1

    def __post_init__(self):
        shape = (self.num_layers, 2, self.num_blocks * self.block_size, self.num_kv_heads, self.head_dim)
        quantized = is_quantized(self.kv_cache_dtype)
        self.tensor = self._zeros(shape, CONTAINER_DTYPE if quantized else self.dtype)
        self.scales = self._zeros(shape[:-1], SCALE_DTYPE) if quantized else None
        self.open = None  # [num_layers, 2, open slots, num_kv_heads, head_dim] in the model's dtype, rotated
        if quantized and self.open_rows:
            self.open = self._zeros((*shape[:2], self.open_rows * self.open_ring * self.block_size, *shape[3:]), self.dtype)
        self.store = KVStore(self.tensor, self.scales, self.kv_cache_dtype, self.dtype, self.open)

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if torch.device(self.device).type == "cpu":
            return lazy_zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """Everything a block owns, each [num_layers, 2, num_slots, ...]: the values, and their scales if any."""
        return [self.tensor] if self.scales is None else [self.tensor, self.scales]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def open_nbytes(self) -> int:
        """The exact open blocks' bytes, beside the pool (on a CPU committed as rows are used)."""
        return 0 if self.open is None else self.open.numel() * self.open.element_size()

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers, K and V, scales too) before the step writes into them."""
        bs = self.block_size
        for t in self.tensors:
            for src, dst in copies:
                t[:, :, dst * bs : (dst + 1) * bs] = t[:, :, src * bs : (src + 1) * bs]

    def copy_open_rows(self, copies: list[tuple[int, int]]) -> None:
        """A fork's open block: the parent's row of exact K/V, all layers, into the child's."""
        n = self.open_ring * self.block_size
        for src, dst in copies:
            self.open[:, :, dst * n : (dst + 1) * n] = self.open[:, :, src * n : (src + 1) * n]


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor whose memory is committed page by page as it is first written.

    torch.zeros writes every byte up front: slow for a large pool, and all of it resident
    before a single request. An anonymous mmap is zero pages the OS commits on first touch, so
    a pool sized for the worst case costs memory only as blocks are used. (The zeros matter:
    padded reads of unwritten slots must be finite.) Not numpy's zeros: numpy asks for huge
    pages on large arrays, and with the kernel's default `defrag=madvise` each first write to a
    2 MiB page then waits for the kernel to compact and zero it, which made prefills and whole
    workloads slower (the README's list of what makes the CPU path fast has the figures).
    """
    numel = int(np.prod(shape))
    buffer = mmap.mmap(-1, numel * torch.empty((), dtype=dtype).element_size())  # page-aligned
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


def num_blocks_for_budget(budget_bytes: int, bytes_per_token: int, block_size: int) -> int:
    n = budget_bytes // (bytes_per_token * block_size)
    if n < 1:
        raise ValueError(
            f"KV budget of {budget_bytes} bytes holds no block of {block_size} tokens "
            f"({bytes_per_token} bytes per token); raise kv_cache_memory or lower block_size"
        )
    return int(n)
