"""KV cache memory: a contiguous per-sequence cache (stage 01) and a paged pool with a BlockManager (stage 02)."""
from .block_manager import BlockManager, NoFreeBlocksError
from .contiguous import ContiguousKVCache
from .paged import KVPool

__all__ = ["BlockManager", "ContiguousKVCache", "KVPool", "NoFreeBlocksError"]
