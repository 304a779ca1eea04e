"""Fixed-size KV blocks: a free list, reference counts and one block table per sequence.

Reference counts count block tables only. A block with no references is either on the
free list or, if a prefix cache holds it, kept filled until the cache evicts it.

A block holds `block_size` consecutive tokens of one sequence. A sequence's block table
lists its blocks in order, so token i lives at slot `block_table[i // block_size] *
block_size + i % block_size`. Blocks are shared by reference counting: a forked child
(`SamplingParams(n>1)`) or a prefix-cache hit points at the same block, and writing
into a shared block copies it first (copy-on-write). A prefix cache holds references of
its own; when the free list runs dry the manager asks it to evict.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..sequence import Sequence


class NoFreeBlocksError(RuntimeError):
    """Raised by allocate() when the pool is exhausted; the scheduler checks can_allocate first."""


@dataclass
class BlockEvent:
    """One line of the optional allocation log: who took or released which block, and what is left."""

    op: str  # "alloc" | "free" | "share" | "cow" | "evict"
    seq_id: int | None
    block_id: int
    ref_count: int
    num_free_blocks: int


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, log: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must both be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_count = [0] * num_blocks
        # Used as a stack: the block freed last is taken first, while its memory is resident and
        # likely in cache; a queue would cycle through the whole pool, every block cold when its turn came.
        self.free_blocks: list[int] = list(reversed(range(num_blocks)))
        self.prefix_cache = None  # set by the engine when prefix caching is on
        self.pending_copies: list[tuple[int, int]] = []  # (src, dst) block copies the runner must do
        self.num_evicted_blocks = 0  # cached blocks the prefix cache gave back to make room, ever
        self.log: list[BlockEvent] | None = [] if log else None

    # -- bookkeeping -------------------------------------------------------------------------
    def _record(self, op: str, seq: Sequence | None, block: int) -> None:
        if self.log is not None:
            seq_id = seq.seq_id if seq is not None else None
            self.log.append(BlockEvent(op, seq_id, block, self.ref_count[block], len(self.free_blocks)))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_available_blocks(self) -> int:
        """Free now, plus blocks only the prefix cache holds (it gives them up on demand)."""
        evictable = self.prefix_cache.num_evictable_blocks() if self.prefix_cache else 0
        return len(self.free_blocks) + evictable

    def incref(self, block: int, seq: Sequence | None = None) -> None:
        if self.ref_count[block] == 0 and self.prefix_cache is not None:
            self.prefix_cache.on_referenced(block)  # a cache hit revives an idle cached block
        self.ref_count[block] += 1
        self._record("share", seq, block)

    def decref(self, block: int, seq: Sequence | None = None) -> None:
        assert self.ref_count[block] > 0, f"block {block} freed twice"
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            # A block the prefix cache holds stays filled, ready for the next hit, until evicted.
            if self.prefix_cache is not None and self.prefix_cache.holds(block):
                self.prefix_cache.on_unreferenced(block)
            else:
                self.free_blocks.append(block)
        self._record("free", seq, block)

    def release_cached(self, block: int) -> None:
        """The prefix cache evicted an idle block: it goes back to the free list."""
        assert self.ref_count[block] == 0, f"evicting block {block} still in use"
        self.free_blocks.append(block)
        self.num_evicted_blocks += 1
        self._record("evict", None, block)

    def _take_block(self, seq: Sequence) -> int:
        if not self.free_blocks and self.prefix_cache is not None:
            self.prefix_cache.evict(1)
        if not self.free_blocks:
            raise NoFreeBlocksError("KV pool exhausted")
        block = self.free_blocks.pop()
        self.ref_count[block] = 1
        self._record("alloc", seq, block)
        return block

    # -- what the scheduler calls ------------------------------------------------------------
    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks to hold `num_new_tokens` more K/V entries, counting a copy-on-write if needed."""
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        needed = max(0, total - len(seq.block_table))
        return needed + (1 if self._write_block_is_shared(seq) else 0)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(seq, num_new_tokens) <= self.num_available_blocks

    def _write_block_is_shared(self, seq: Sequence) -> bool:
        """Is the block the next token writes into read by someone else (a fork, or the prefix cache)?"""
        i = seq.num_computed_tokens // self.block_size
        if i >= len(seq.block_table):
            return False
        block = seq.block_table[i]
        return self.ref_count[block] > 1 or (self.prefix_cache is not None and self.prefix_cache.holds(block))

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
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        while len(seq.block_table) < total:
            seq.block_table.append(self._take_block(seq))

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks others still use (cache, forks) stay alive."""
        for block in reversed(seq.block_table):
            self.decref(block, seq)
        seq.block_table = []

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: keep the blocks of the first `num_tokens` positions, release the rest.

        The blocks dropped were allocated for proposals this step; no prefix cache holds them,
        because the cache only takes full blocks of computed (accepted) tokens.
        """
        keep = -(-num_tokens // self.block_size)
        while len(seq.block_table) > keep:
            self.decref(seq.block_table.pop(), seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child reads the parent's blocks; the first write into a shared one copies it."""
        child.block_table = list(parent.block_table)
        for block in child.block_table:
            self.incref(block, child)

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
