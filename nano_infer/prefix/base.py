"""What every prefix cache does for the scheduler, whatever its data structure.

Granularity is the block: only full blocks are shared, because a block is the unit the
attention reads through a block table. A hit of k blocks means the request starts with
`num_computed_tokens = k * block_size` and prefills only the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..sequence import Sequence


@dataclass
class PrefixCacheStats:
    num_queries: int = 0
    query_tokens: int = 0  # prompt tokens of admitted requests
    hit_tokens: int = 0  # of those, served from the cache

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixCache:
    """Subclasses implement match/cache_computed/evict and the block-ownership hooks."""

    def __init__(self, block_manager):
        self.block_manager = block_manager
        self.block_size = block_manager.block_size
        self.stats = PrefixCacheStats()
        block_manager.prefix_cache = self

    # -- implemented by each cache -----------------------------------------------------------
    def match(self, token_ids: list[int]) -> list[int]:
        """Blocks holding the longest cached prefix of `token_ids`, whole blocks only.

        Marks the matched entries as recently used; takes no references.
        """
        raise NotImplementedError

    def cache_computed(self, seq: Sequence) -> None:
        """Offer the sequence's full, computed blocks to the cache (called after every step)."""
        raise NotImplementedError

    def release(self, seq: Sequence) -> None:
        """The sequence stops using its cached prefix (finished or preempted)."""

    def holds(self, block: int) -> bool:
        raise NotImplementedError

    def on_referenced(self, block: int) -> None:
        """An idle cached block got a reference: it may no longer be evicted."""

    def on_unreferenced(self, block: int) -> None:
        """A cached block lost its last reference: it may be evicted from now on."""

    def num_evictable_blocks(self) -> int:
        raise NotImplementedError

    def evict(self, num_blocks: int) -> int:
        """Free at least `num_blocks` idle cached blocks if possible; returns how many were freed."""
        raise NotImplementedError

    def num_cached_blocks(self) -> int:
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------
    def acquire(self, seq: Sequence) -> int:
        """Admit a fresh sequence onto its cached prefix: share the blocks, skip their prefill.

        If the whole sequence is cached, the last token is still computed (its logits give
        the first output token); writing its K/V into the shared last block triggers a
        copy-on-write of that one block.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        blocks = self.match(seq.token_ids)
        for block in blocks:
            self.block_manager.incref(block, seq)
        seq.block_table = list(blocks)
        seq.num_computed_tokens = min(len(blocks) * self.block_size, len(seq) - 1)
        self._lock(seq, blocks)
        return len(blocks) * self.block_size

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """A forked child shares the parent's cached prefix.

        The parent's freshly computed blocks are cached first, so the child holds the same,
        up-to-date prefix and keeps it even if the parent finishes at once.
        """
        self.cache_computed(parent)
        child.block_hashes = list(parent.block_hashes)

    def _lock(self, seq: Sequence, blocks: list[int]) -> None:
        """Radix tree: lock the matched path. The hash cache needs nothing: references protect blocks."""

    def record_admission(self, seq: Sequence) -> None:
        """Count a request's prompt once: re-admission after preemption is recompute, not a new query."""
        if seq.num_preemptions:
            return
        self.stats.num_queries += 1
        self.stats.query_tokens += seq.num_prompt_tokens
        seq.num_cached_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
        self.stats.hit_tokens += seq.num_cached_tokens

    def clear(self) -> int:
        """Evict everything idle; returns the number of blocks freed."""
        return self.evict(self.num_evictable_blocks())
