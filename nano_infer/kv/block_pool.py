"""Block ids, a reference count each and a free list: the bookkeeping every pool of KV blocks shares.

The device `BlockManager` (chapter 02), the contiguous cache (chapter 01, one block per sequence) and the
host tier (chapter 12) each hold one, so "a block is free exactly when nothing references it" is written
once. A reference is a holder: a block table, a prefix cache, an index, a copy still to run.
"""
from __future__ import annotations


class NoFreeBlocksError(RuntimeError):
    """Raised by take() when the pool is exhausted; callers check num_free_blocks (or can_allocate) first."""


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_count = [0] * num_blocks
        # Used as a stack: the block freed last is taken first, while its memory is resident and
        # likely in cache; a queue would cycle through the whole pool, every block cold when its turn came.
        self.free_blocks: list[int] = list(reversed(range(num_blocks)))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def take(self) -> int:
        """A free block, with one reference: the caller's."""
        if not self.free_blocks:
            raise NoFreeBlocksError("KV pool exhausted")
        block = self.free_blocks.pop()
        self.ref_count[block] = 1
        return block

    def incref(self, block: int) -> None:
        self.ref_count[block] += 1

    def decref(self, block: int) -> bool:
        """Drop one reference; returns whether it was the last (the block is free again)."""
        assert self.ref_count[block] > 0, f"block {block} freed twice"
        self.ref_count[block] -= 1
        if self.ref_count[block]:
            return False
        self.free_blocks.append(block)
        return True
