"""KV cache memory: a contiguous per-sequence cache (chapter 01) and a paged pool with a BlockManager (chapter 02)."""
from .block_manager import BlockManager
from .block_pool import BlockPool, NoFreeBlocksError
from .contiguous import ContiguousKVCache
from .paged import KVPool

__all__ = ["BlockManager", "BlockPool", "ContiguousKVCache", "KVPool", "NoFreeBlocksError"]
