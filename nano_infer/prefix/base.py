"""What every prefix cache does, whatever its data structure.

Granularity is the block: only full blocks are shared, because a block is the unit the
attention reads through a block table. A hit of k blocks means the request starts with
`num_computed_tokens = k * block_size` and prefills only the rest.

A cache never touches the BlockManager. It answers what it holds, which blocks it takes
(`cache_computed`) and which it gives back (`evict`); the `KVManager` above both takes and
drops the cache's one reference on each of those blocks. Calls go one way: manager -> cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from ..core.sequence import Sequence
from .hashing import BlockHashes

Handle = TypeVar("Handle")


@dataclass
class PrefixCacheStats:
    num_queries: int = 0
    query_tokens: int = 0  # prompt tokens of admitted requests
    hit_tokens: int = 0  # of those, served from the cache

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixCache(Generic[Handle]):
    """Subclasses implement match / cache_computed / evict and say which blocks they hold."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.stats = PrefixCacheStats()
        self.hashes = BlockHashes(block_size)  # the chains of block hashes the hash cache and the host tier key by
        # each sequence's own record with this cache, by seq_id: the radix tree's locked node, or how many of
        # its full blocks the hash cache has been offered
        self.handles: dict[int, Handle] = {}

    # -- implemented by each cache -----------------------------------------------------------
    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]:
        """Blocks holding the longest cached prefix of `token_ids`, whole blocks only, among the
        blocks cached under the same `salt` (SamplingParams.cache_salt): a cache shared by tenants
        must not let one reuse, and so time, another's prompt.

        Marks the matched entries as recently used; takes no references.
        """
        raise NotImplementedError

    def cache_computed(self, seq: Sequence) -> list[int]:
        """Offer the sequence's full, computed blocks (after every step). Returns the blocks the
        cache newly holds: the caller takes the cache's reference on each."""
        raise NotImplementedError

    def lock(self, seq: Sequence, blocks: list[int]) -> None:
        """The sequence starts on its matched prefix `blocks`. The radix tree locks that path; the
        hash cache needs nothing (the sequence's references protect the blocks)."""

    def release(self, seq: Sequence) -> None:
        """The sequence stops using its cached prefix (finished or preempted)."""
        self.handles.pop(seq.seq_id, None)

    def fork(self, parent: Sequence, child: Sequence) -> list[int]:
        """A forked child shares the parent's cached prefix.

        The parent's freshly computed blocks are cached first, so the child holds the same,
        up-to-date prefix and keeps it even if the parent finishes at once. Returns the blocks
        newly cached, as `cache_computed` does.
        """
        new = self.cache_computed(parent)
        if parent.seq_id in self.handles:
            self.handles[child.seq_id] = self.handles[parent.seq_id]
        return new

    def holds(self, block: int) -> bool:
        raise NotImplementedError

    def on_referenced(self, block: int) -> None:
        """An idle cached block got a sequence's reference: it may no longer be evicted."""

    def on_unreferenced(self, block: int) -> None:
        """A cached block lost its last sequence's reference: it may be evicted from now on."""

    def num_evictable_blocks(self) -> int:
        raise NotImplementedError

    def evict(self, num_blocks: int) -> list[int]:
        """Give back up to `num_blocks` idle cached blocks; returns them (the caller drops the
        cache's reference on each, which frees them)."""
        raise NotImplementedError

    def num_cached_blocks(self) -> int:
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------------
    def record_admission(self, seq: Sequence) -> None:
        """Count a request's prompt once: re-admission after preemption is recompute, not a new query."""
        if seq.num_preemptions:
            return
        self.stats.num_queries += 1
        self.stats.query_tokens += seq.num_prompt_tokens
        self.stats.hit_tokens += min(seq.num_computed_tokens, seq.num_prompt_tokens)
