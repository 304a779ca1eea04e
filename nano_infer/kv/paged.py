"""The KV pool: one tensor, allocated once, that every sequence's K/V lives in.

Shape [num_layers, 2 (K and V), num_blocks * block_size, num_kv_heads, head_dim]. A new
token's K/V goes to its slot (`block_id * block_size + offset`, the slot mapping);
attention reads a sequence's keys through its block table. The pool is sized from a
byte budget, so "how many tokens fit" is a number you can compute before serving.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np
import torch


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
    dtype: torch.dtype
    device: torch.device

    def __post_init__(self):
        shape = (self.num_layers, 2, self.num_blocks * self.block_size, self.num_kv_heads, self.head_dim)
        if torch.device(self.device).type == "cpu":
            self.tensor = lazy_zeros(shape, self.dtype)
        else:
            self.tensor = torch.zeros(shape, dtype=self.dtype, device=self.device)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers, K and V) before the step writes into them."""
        bs = self.block_size
        for src, dst in copies:
            self.tensor[:, :, dst * bs : (dst + 1) * bs] = self.tensor[:, :, src * bs : (src + 1) * bs]


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
