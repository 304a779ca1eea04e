"""Prefix caching: reuse the KV blocks of a prompt prefix another request already computed.

Two implementations of one interface (`PrefixCache`): chained hashes of full blocks
(stage 03, vLLM's approach) and a radix tree (stage 04, SGLang's RadixAttention).
"""
from .base import PrefixCache, PrefixCacheStats
from .hash_cache import HashPrefixCache
from .radix import RadixPrefixCache


def make_prefix_cache(kind: str | None, block_manager):
    if kind is None:
        return None
    caches = {"hash": HashPrefixCache, "radix": RadixPrefixCache}
    if kind not in caches:
        raise ValueError(f"prefix_cache={kind!r} is invalid: use 'hash', 'radix' or None")
    return caches[kind](block_manager)


__all__ = ["HashPrefixCache", "PrefixCache", "PrefixCacheStats", "RadixPrefixCache", "make_prefix_cache"]
