"""How many KV blocks to make, from a byte budget, and the cache objects that hold them.

On a CPU the pool gets vLLM's CPU default of 4 GiB or half the memory still available after
the weights, whichever is less (and never more than max_num_seqs full-length sequences could
use); its pages are committed only as blocks fill (`paged.lazy_zeros`). On CUDA it gets
`gpu_memory_utilization` of the device, less the weights and room for one step's activations.
"""
from __future__ import annotations

import torch

from ..prefix import make_prefix_cache
from ..core.utils import cdiv
from .block_manager import BlockManager
from .cost import CostModel
from .host_tier import HostTier
from .contiguous import ContiguousKVCache
from .manager import KVManager
from .open_blocks import OpenBlocks
from .quant import is_quantized
from .paged import KVPool, num_blocks_for_budget

CPU_KV_BUDGET = 4 * 1024**3
CPU_KV_AVAILABLE_FRACTION = 0.5


def kv_budget(cfg, device: torch.device, hf_config) -> int:
    """Bytes the KV pool may take."""
    if cfg.kv_cache_memory is not None:
        return int(cfg.kv_cache_memory)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        # leave room for activations: a step of max_num_batched_tokens through the widest layer
        activations = 8 * cfg.max_num_batched_tokens * max(hf_config.intermediate_size, hf_config.vocab_size) * 4
        return int(total * cfg.gpu_memory_utilization - torch.cuda.memory_allocated(device) - activations)
    import psutil

    return min(CPU_KV_BUDGET, int(psutil.virtual_memory().available * CPU_KV_AVAILABLE_FRACTION))


def make_kv_cache(cfg, hf_config, model, dtype, device, bytes_per_token: int, max_model_len: int):
    """(KVManager, KVPool) for `cfg.kv_cache`, or (None, None) for kv_cache="none"."""
    if cfg.kv_cache == "none":
        return None, None
    if cfg.kv_cache == "contiguous":
        num_seqs = min(cfg.max_num_seqs, kv_budget(cfg, device, hf_config) // (bytes_per_token * max_model_len))
        if num_seqs < 1:
            raise ValueError(f"KV budget holds no {max_model_len}-token sequence; lower max_model_len")
        blocks = ContiguousKVCache(num_seqs, max_model_len)
    else:
        num_blocks = cfg.num_kv_blocks
        if num_blocks is None:
            num_blocks = num_blocks_for_budget(kv_budget(cfg, device, hf_config), bytes_per_token, cfg.block_size)
            # never more than every sequence at full length could use
            num_blocks = min(num_blocks, cfg.max_num_seqs * cdiv(max_model_len, cfg.block_size) + 1)
        open_blocks = None
        if is_quantized(cfg.kv_cache_dtype):  # each running sequence's open block kept exact beside the pool
            open_blocks = OpenBlocks(cfg.max_num_seqs, cfg.block_size, open_block_ring(cfg))
        blocks = BlockManager(num_blocks, cfg.block_size, log=cfg.log_blocks, open_blocks=open_blocks)
    pool = KVPool(hf_config.num_hidden_layers, blocks.num_blocks, blocks.block_size, model.num_kv_heads,
                  model.head_dim, dtype, device, cfg.kv_cache_dtype, *open_block_shape(blocks.open_blocks))
    tier = cost = None
    if cfg.kv_offloading_size:
        tier = HostTier(num_host_blocks(cfg, bytes_per_token), blocks.block_size, bytes_per_token * blocks.block_size)
        cost = CostModel(bytes_per_token * blocks.block_size)
    kv = KVManager(blocks, make_prefix_cache(cfg.prefix_cache, blocks.block_size), tier, cost, cfg.preemption_mode)
    return kv, pool


def open_block_ring(cfg) -> int:
    """Exact blocks a sequence keeps: 2 with speculative decoding (a verify may cross into the next block and
    roll back out of it), else 1."""
    if cfg.speculative_config is None:
        return 1
    if cfg.speculative_config.num_speculative_tokens > cfg.block_size:
        raise ValueError(f"kv_cache_dtype={cfg.kv_cache_dtype!r} keeps each sequence's open block exact, and a verify "
                         f"may cross one block only: num_speculative_tokens must be at most block_size={cfg.block_size}")
    return 2


def open_block_shape(open_blocks) -> tuple[int, int]:
    """(rows, ring) of the pool's exact open blocks; (0, 1) for none."""
    return (open_blocks.num_rows, open_blocks.ring) if open_blocks.ring else (0, 1)


def num_host_blocks(cfg, bytes_per_token: int) -> int:
    """Blocks of the host tier: kv_offloading_size GiB over all tensor-parallel ranks, each rank holding
    its shard of every block (`bytes_per_token` is one rank's)."""
    per_block = bytes_per_token * cfg.block_size * cfg.tensor_parallel_size
    n = int(cfg.kv_offloading_size * 2**30) // per_block
    if n < 1:
        raise ValueError(f"kv_offloading_size={cfg.kv_offloading_size} GiB holds no KV block ({per_block:,} bytes "
                         f"each over {cfg.tensor_parallel_size} rank(s)); raise it or set 0 for no host tier")
    return n
