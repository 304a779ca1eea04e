"""Stage 01: every sequence owns one region of `max_model_len` token slots, reserved up front.

This is how early Transformers-based serving worked: simple, and wasteful - a request
that generates 50 tokens still reserves room for `max_model_len`. It has the same
interface as the BlockManager, because it *is* a block manager whose single block per
sequence is as long as the model's context. Reading it this way makes stage 02's
change small: shrink the block, give each sequence a list of them.
"""
from __future__ import annotations

from collections import deque

from ..engine.sequence import Sequence


class ContiguousKVCache:
    def __init__(self, max_num_seqs: int, max_model_len: int):
        self.num_blocks = max_num_seqs
        self.block_size = max_model_len  # one "block" = one whole sequence's reservation
        self.free_blocks: deque[int] = deque(range(max_num_seqs))
        self.ref_count = [0] * max_num_seqs
        self.pending_copies: list[tuple[int, int]] = []
        self.prefix_cache = None

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    num_available_blocks = num_free_blocks

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return 0 if seq.block_table else 1

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= len(self.free_blocks)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        if not seq.block_table:
            block = self.free_blocks.popleft()
            self.ref_count[block] = 1
            seq.block_table = [block]

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: the one block spans the whole context, so there is nothing to give back."""

    def free(self, seq: Sequence) -> None:
        for block in seq.block_table:
            self.ref_count[block] = 0
            self.free_blocks.append(block)
        seq.block_table = []
