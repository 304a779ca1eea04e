"""The prefix cache of an engine without one: it never matches and holds nothing.

The `KVManager` drives it exactly like a real `PrefixCache`, so its code has no branch for "no
prefix cache": a match is empty, nothing is offered back, nothing is ever idle or evicted.
"""
from __future__ import annotations

from ..core.sequence import Sequence
from .base import PrefixCache


class NoPrefixCache(PrefixCache[None]):
    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]:
        return []

    def cache_computed(self, seq: Sequence) -> list[int]:
        return []

    def holds(self, block: int) -> bool:
        return False

    def num_evictable_blocks(self) -> int:
        return 0

    def evict(self, num_blocks: int) -> list[int]:
        return []

    def num_cached_blocks(self) -> int:
        return 0
