"""Stage 03: a prefix cache keyed by chained hashes of full blocks (vLLM's automatic prefix caching).

Block i's key is hash(key of block i-1, token ids of block i), so a key names the whole
prefix up to and including that block: two equal blocks at different places in different
prompts never collide. A hit is verified against the stored token ids and parent key, so a
hash collision can cost a miss but never a wrong answer.

A `cache_salt` (SamplingParams) starts the chain from a hash of the salt instead of ROOT_HASH, so
requests with different salts share no block, not even the first.

Idle cached blocks (no sequence references them) wait in an LRU order and are evicted,
least recently used first, only when the pool needs a block.
"""
from __future__ import annotations

from collections import OrderedDict

from ..engine.sequence import Sequence
from .base import PrefixCache, salt_of

ROOT_HASH = 0


def chain_hash(parent_hash: int, tokens: tuple[int, ...]) -> int:
    return hash((parent_hash, tokens))


def root_hash(salt: str | None) -> int:
    return ROOT_HASH if salt is None else hash(("cache_salt", salt))


class HashPrefixCache(PrefixCache):
    def __init__(self, block_size: int):
        super().__init__(block_size)
        self.hash_to_block: dict[int, int] = {}
        self.block_key: dict[int, tuple[int, int, tuple[int, ...]]] = {}  # block -> (hash, parent hash, tokens)
        self.idle: OrderedDict[int, None] = OrderedDict()  # evictable blocks, least recently used first

    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]:
        bs, blocks, parent = self.block_size, [], root_hash(salt)
        for start in range(0, len(token_ids) - bs + 1, bs):
            tokens = tuple(token_ids[start : start + bs])
            h = chain_hash(parent, tokens)
            block = self.hash_to_block.get(h)
            if block is None or self.block_key[block][1:] != (parent, tokens):
                break
            blocks.append(block)
            parent = h
        for block in reversed(blocks):  # touch tail first, so the head ends most recent: evicted last
            if block in self.idle:
                self.idle.move_to_end(block)
        return blocks

    def cache_computed(self, seq: Sequence) -> list[int]:
        """Hash each newly full block after the last one hashed (the sequence's handle keeps its
        chain of hashes); a block is cached unless its prefix already is, under another block."""
        bs, new = self.block_size, []
        num_full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        hashes = seq.prefix_handle = seq.prefix_handle or []
        while len(hashes) < num_full:
            i = len(hashes)
            parent = hashes[-1] if hashes else root_hash(salt_of(seq))
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            hashes.append(h)
            block = seq.block_table[i]
            if h not in self.hash_to_block and block not in self.block_key:
                self.hash_to_block[h] = block
                self.block_key[block] = (h, parent, tokens)
                new.append(block)
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
            h = self.block_key.pop(block)[0]
            del self.hash_to_block[h]
            freed.append(block)
        return freed
