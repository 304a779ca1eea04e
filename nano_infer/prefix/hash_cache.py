"""Chapter 03: a prefix cache keyed by chained hashes of full blocks (vLLM's automatic prefix caching).

Each full block is cached under its `BlockKey` (prefix/hashing.py): a hash that names the whole prefix up to
the end of the block, started from the request's cache_salt, with the parent hash and the tokens kept to
verify a hit. Matching walks a prompt's keys front to back and stops at the first miss.

Idle cached blocks (no sequence references them) wait in an LRU order and are evicted,
least recently used first, only when the pool needs a block.
"""
from __future__ import annotations

from collections import OrderedDict

from ..core.sequence import Sequence
from .base import PrefixCache
from .hashing import BlockKey, block_keys


class HashPrefixCache(PrefixCache[int]):
    def __init__(self, block_size: int):
        super().__init__(block_size)
        self.hash_to_block: dict[int, int] = {}
        self.block_key: dict[int, BlockKey] = {}  # cached block -> its key
        self.idle: OrderedDict[int, None] = OrderedDict()  # evictable blocks, least recently used first

    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]:
        blocks = []
        for key in block_keys(token_ids, self.block_size, salt):
            block = self.hash_to_block.get(key.hash)
            if block is None or self.block_key[block] != key:
                break
            blocks.append(block)
        for block in reversed(blocks):  # touch tail first, so the head ends most recent: evicted last
            if block in self.idle:
                self.idle.move_to_end(block)
        return blocks

    def cache_computed(self, seq: Sequence) -> list[int]:
        """Key each full computed block not offered yet (the sequence's handle counts those offered); a
        block is cached unless its prefix already is, under another block."""
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        offered, new = self.handles.get(seq.seq_id, 0), []
        for i in range(offered, num_full):
            key, block = self.hashes.key(seq, i), seq.block_table[i]
            if key.hash not in self.hash_to_block and block not in self.block_key:
                self.hash_to_block[key.hash] = block
                self.block_key[block] = key
                new.append(block)
        self.handles[seq.seq_id] = max(offered, num_full)
        return new

    def holds(self, block: int) -> bool:
        return block in self.block_key

    def on_referenced(self, block: int) -> None:
        self.idle.pop(block, None)

    def on_unreferenced(self, block: int) -> None:
        self.idle[block] = None

    def num_evictable_blocks(self) -> int:
        return len(self.idle)

    def num_cached_blocks(self) -> int:
        return len(self.block_key)

    def evict(self, num_blocks: int) -> list[int]:
        freed = []
        while len(freed) < num_blocks and self.idle:
            block, _ = self.idle.popitem(last=False)
            del self.hash_to_block[self.block_key.pop(block).hash]
            freed.append(block)
        return freed
