"""Chapter 01: every sequence owns one region of `max_model_len` token slots, reserved up front.

This is how early Transformers-based serving worked: simple, and wasteful - a request
that generates 50 tokens still reserves room for `max_model_len`. It has the same
interface as the BlockManager, because it *is* a block manager whose single block per
sequence is as long as the model's context. Reading it this way makes chapter 02's
change small: shrink the block, give each sequence a list of them.
"""
from __future__ import annotations

from ..core.sequence import Sequence
from .block_pool import BlockPool
from .open_blocks import NoOpenBlocks


class ContiguousKVCache:
    def __init__(self, max_num_seqs: int, max_model_len: int):
        self.num_blocks = max_num_seqs
        self.block_size = max_model_len  # one "block" = one whole sequence's reservation
        self.pool = BlockPool(max_num_seqs)  # the free regions (a reference count of 0 or 1 each)
        self.pending_copies: list[tuple[int, int]] = []  # never any: no block is shared, nothing copies on write
        self.open_blocks = NoOpenBlocks()  # its K/V is never 8-bit

    @property
    def ref_count(self) -> list[int]:
        return self.pool.ref_count

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return 0 if seq.block_table else 1

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        if not seq.block_table:
            seq.block_table = [self.pool.take()]

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: the one block spans the whole context, so there is nothing to give back."""

    def free(self, seq: Sequence) -> None:
        for block in seq.block_table:
            self.pool.decref(block)
        seq.block_table = []
