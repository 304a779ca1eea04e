"""Fixed-size KV blocks: one block table per sequence, over a `BlockPool` of reference counts and a free list.

Reference counts count holders: block tables, and the prefix cache for each block it
keeps. A block with no references is on the free list.

A block holds `block_size` consecutive tokens of one sequence. A sequence's block table
lists its blocks in order, so token i lives at slot `block_table[i // block_size] *
block_size + i % block_size`. Blocks are shared by reference counting: a forked child
(`SamplingParams(n>1)`) or a prefix-cache hit points at the same block, and writing
into a shared block copies it first (copy-on-write). A prefix cache holds a reference of
its own on every block it keeps, so "shared" is simply a reference count above one; the
`KVManager` above both decides when the cache gives blocks back.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.sequence import Sequence
from ..core.utils import cdiv
from .block_pool import BlockPool
from .open_blocks import NoOpenBlocks, OpenBlocks


@dataclass
class BlockEvent:
    """One line of the optional allocation log: who took or released which block, and what is left."""

    op: str  # "alloc" | "free" | "share" | "cow" | "evict"
    seq_id: int | None
    block_id: int
    ref_count: int
    num_free_blocks: int


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, log: bool = False, open_blocks: OpenBlocks | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must both be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.pending_copies: list[tuple[int, int]] = []  # (src, dst) block copies the runner must do
        self.log: list[BlockEvent] | None = [] if log else None
        # 8-bit K/V (chapter 14): each sequence's open block kept exact beside the pool, a row each
        self.open_blocks = open_blocks if open_blocks is not None else NoOpenBlocks()

    # -- bookkeeping -------------------------------------------------------------------------
    def _record(self, op: str, seq: Sequence | None, block: int) -> None:
        if self.log is not None:
            seq_id = seq.seq_id if seq is not None else None
            self.log.append(BlockEvent(op, seq_id, block, self.pool.ref_count[block], self.pool.num_free_blocks))

    @property
    def ref_count(self) -> list[int]:
        return self.pool.ref_count

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def incref(self, block: int, seq: Sequence | None = None) -> None:
        self.pool.incref(block)
        self._record("share", seq, block)

    def decref(self, block: int, seq: Sequence | None = None, op: str = "free") -> None:
        """Drop one reference (`op` names it in the log: "evict" when the prefix cache lets go)."""
        self.pool.decref(block)
        self._record(op, seq, block)

    def _take_block(self, seq: Sequence) -> int:
        block = self.pool.take()
        self._record("alloc", seq, block)
        return block

    # -- what the scheduler calls ------------------------------------------------------------
    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks to hold `num_new_tokens` more K/V entries, counting a copy-on-write if needed."""
        total = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size)
        needed = max(0, total - len(seq.block_table))
        return needed + (1 if self._write_block_is_shared(seq) else 0)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks and self.open_blocks.has_room(seq)

    def _write_block_is_shared(self, seq: Sequence) -> bool:
        """Is the block the next token writes into read by someone else (a fork, or the prefix cache)?"""
        i = seq.num_computed_tokens // self.block_size
        return i < len(seq.block_table) and self.pool.ref_count[seq.block_table[i]] > 1

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room for the next `num_new_tokens` K/V entries of `seq` (the append_slot of vLLM v0)."""
        if self._write_block_is_shared(seq):  # copy-on-write: never write into a block others read
            i = seq.num_computed_tokens // self.block_size
            src = seq.block_table[i]
            dst = self._take_block(seq)
            self.pending_copies.append((src, dst))
            seq.block_table[i] = dst
            self.decref(src, seq)
            self._record("cow", seq, dst)
        total = cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size)
        while len(seq.block_table) < total:
            seq.block_table.append(self._take_block(seq))
        self.open_blocks.take(seq)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks others still use (cache, forks) stay alive."""
        self.open_blocks.release(seq)
        for block in reversed(seq.block_table):
            self.decref(block, seq)
        seq.block_table = []

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: keep the blocks of the first `num_tokens` positions, release the rest.

        The blocks dropped were allocated for proposals this step; no prefix cache holds them,
        because the cache only takes full blocks of computed (accepted) tokens.
        """
        keep = cdiv(num_tokens, self.block_size)
        while len(seq.block_table) > keep:
            self.decref(seq.block_table.pop(), seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child reads the parent's blocks; the first write into a shared one copies it."""
        child.block_table = list(parent.block_table)
        for block in child.block_table:
            self.incref(block, child)
        self.open_blocks.fork(parent, child)

    def slot(self, seq: Sequence, position: int) -> int:
        return slot_mapping(seq.block_table, position, position + 1, self.block_size)[0]


def slot_mapping(block_table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Where positions [start, end) of a sequence live in the pool: the one slot formula,
    read by `BlockManager.slot` and by the model runner when it packs a step."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]
