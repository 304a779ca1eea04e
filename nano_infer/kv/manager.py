"""KVManager: the one owner of KV memory, the block manager and the prefix cache on top of it.

The scheduler and the engine talk to this object only. It calls down into the two parts it
owns, which never call each other: the `BlockManager` (stage 02) counts references and hands
out free blocks; the `PrefixCache` (stages 03-04) decides which full blocks stay filled for
later requests. The cache holds one reference on every block it keeps, so a cached block
that no sequence reads has a reference count of 1 ("idle") and is not on the free list; when
the free list runs short the manager asks the cache to give idle blocks back and drops the
cache's reference on each, which frees them.

The same manager wraps the contiguous cache of stage 01 (one max-length block per sequence,
no prefix cache): the scheduler does not know which one it drives.
"""
from __future__ import annotations

from ..prefix.base import salt_of
from ..sequence import Sequence


class KVManager:
    def __init__(self, blocks, prefix_cache=None):
        self.blocks = blocks  # BlockManager, or ContiguousKVCache
        self.prefix_cache = prefix_cache  # HashPrefixCache, RadixPrefixCache, or None
        self.block_size = blocks.block_size
        self.num_blocks = blocks.num_blocks
        self.num_evicted_blocks = 0  # cached blocks given back to make room, ever

    # -- what there is ----------------------------------------------------------------------------
    @property
    def ref_count(self) -> list[int]:
        return self.blocks.ref_count

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    @property
    def num_available_blocks(self) -> int:
        """Free now, plus idle blocks only the prefix cache holds (it gives them up on demand)."""
        evictable = self.prefix_cache.num_evictable_blocks() if self.prefix_cache else 0
        return self.blocks.num_free_blocks + evictable

    def holds(self, block: int) -> bool:
        """Does the prefix cache keep this block filled for later requests?"""
        return self.prefix_cache is not None and self.prefix_cache.holds(block)

    def match_len(self, token_ids: list[int], salt: str | None = None) -> int:
        """Blocks of `token_ids` the prefix cache could serve (the LPM policy's sort key)."""
        return len(self.prefix_cache.match(token_ids, salt))

    # -- admission and allocation ---------------------------------------------------------------------
    def acquire(self, seq: Sequence) -> int:
        """Admit a fresh sequence onto its cached prefix: share the blocks, skip their prefill.
        Returns the tokens served from the cache (0 without a prefix cache).

        If the whole sequence is cached, the last token is still computed (its logits give
        the first output token); writing its K/V into the shared last block triggers a
        copy-on-write of that one block. A sequence that still scores its prompt (prompt
        logprobs) takes no hit: the positions a hit skips are the rows it needs (as in vLLM).
        """
        if self.prefix_cache is None:
            return 0
        assert not seq.block_table and seq.num_computed_tokens == 0
        blocks = [] if seq.scores_prompt else self.prefix_cache.match(seq.token_ids, salt_of(seq))
        for block in blocks:
            if self.blocks.ref_count[block] == 1:  # idle: only the cache held it
                self.prefix_cache.on_referenced(block)
            self.blocks.incref(block, seq)
        seq.block_table = list(blocks)
        seq.num_computed_tokens = min(len(blocks) * self.block_size, len(seq) - 1)
        self.prefix_cache.lock(seq, blocks)
        return len(blocks) * self.block_size

    def record_admission(self, seq: Sequence) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.record_admission(seq)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks.num_blocks_needed(seq, num_new_tokens) <= self.num_available_blocks

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Room for the next `num_new_tokens` K/V entries, evicting idle cached blocks if the free list is short."""
        short = self.blocks.num_blocks_needed(seq, num_new_tokens) - self.blocks.num_free_blocks
        if short > 0:
            self.evict(short)
        num_copies = len(self.blocks.pending_copies)
        self.blocks.allocate(seq, num_new_tokens)
        for src, _ in self.blocks.pending_copies[num_copies:]:  # copy-on-write left the cached original to the cache
            self._unreferenced(src)

    def evict(self, num_blocks: int) -> int:
        """Free up to `num_blocks` idle cached blocks, least recently used first; returns how many."""
        if self.prefix_cache is None:
            return 0
        freed = self.prefix_cache.evict(num_blocks)
        for block in freed:
            assert self.blocks.ref_count[block] == 1, f"evicting block {block} still in use"
            self.blocks.decref(block, op="evict")
        self.num_evicted_blocks += len(freed)
        return len(freed)

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write (src, dst) block copies the runner must do before the next forward pass."""
        copies, self.blocks.pending_copies = self.blocks.pending_copies, []
        return copies

    # -- during and after a step ------------------------------------------------------------------------
    def cache_computed(self, seq: Sequence) -> None:
        """Offer the sequence's full computed blocks to the prefix cache; it takes a reference on each it keeps."""
        if self.prefix_cache is not None:
            for block in self.prefix_cache.cache_computed(seq):
                self.blocks.incref(block)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """n > 1: the child reads the parent's blocks (and its cached prefix); writes copy on write."""
        self.blocks.fork(parent, child)
        if self.prefix_cache is not None:
            for block in self.prefix_cache.fork(parent, child):
                self.blocks.incref(block)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: keep the blocks of the first `num_tokens` positions only."""
        self.blocks.truncate(seq, num_tokens)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references (finished or preempted); blocks the cache keeps turn idle."""
        table = seq.block_table
        if self.prefix_cache is not None:
            self.prefix_cache.release(seq)
        self.blocks.free(seq)
        for block in reversed(table):  # the tail turns idle first: evicted before the head
            self._unreferenced(block)

    def _unreferenced(self, block: int) -> None:
        """A sequence dropped `block`: if only the cache holds it now, it is idle (evictable)."""
        if self.prefix_cache is not None and self.blocks.ref_count[block] == 1 and self.prefix_cache.holds(block):
            self.prefix_cache.on_unreferenced(block)

    def finish(self, seq: Sequence) -> None:
        """A sequence is done: its full blocks stay in the prefix cache for later requests, the rest are freed."""
        if seq.block_table:
            self.cache_computed(seq)
        self.free(seq)

    def clear(self) -> int:
        """Evict every idle cached block; returns how many were freed."""
        return self.evict(self.num_available_blocks - self.blocks.num_free_blocks)
