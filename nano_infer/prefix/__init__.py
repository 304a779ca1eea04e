"""Prefix caching: reuse the KV blocks of a prompt prefix another request already computed.

Two implementations of one interface (`PrefixCache`), so the KV manager and the scheduler never ask
which one runs: chained hashes of full blocks (chapter 03, vLLM's approach; the keys in hashing.py)
and a radix tree (chapter 04, SGLang's RadixAttention).
"""
from .base import PrefixCache, PrefixCacheStats
from .hash_cache import HashPrefixCache
from .radix import RadixPrefixCache

PREFIX_CACHES = {"hash": HashPrefixCache, "radix": RadixPrefixCache}


def make_prefix_cache(kind: str | None, block_size: int) -> PrefixCache | None:
    return None if kind is None else PREFIX_CACHES[kind](block_size)


__all__ = ["HashPrefixCache", "PrefixCache", "PrefixCacheStats", "RadixPrefixCache", "make_prefix_cache"]
