"""What a tensor-parallel worker runs the driver's steps on: its shard of the model and its own KV pool,
under the same `ModelRunner` as the driver. The driver names `worker_runner` in the `WorkerConfig` it
sends (distributed/worker.py); each worker process builds its runner with it."""
from __future__ import annotations

import torch

from ..distributed import TPShard, WorkerConfig
from ..kv import KVPool
from ..models.loader import load_config, load_model, resolve_model_dir
from .cpu_allocator import keep_freed_memory
from .model_runner import ModelRunner


def worker_runner(cfg: WorkerConfig, shard: TPShard, device: torch.device) -> ModelRunner:
    """Load this rank's shard, make its pool (the same block ids as the driver's) and its host tier, if any."""
    if device.type == "cpu":
        keep_freed_memory()
    model_dir = resolve_model_dir(cfg.model)
    config = load_config(model_dir)
    model = load_model(model_dir, config, device, cfg.dtype, cfg.max_model_len, shard)
    pool = None
    if cfg.num_blocks is not None:
        pool = KVPool(config.num_hidden_layers, cfg.num_blocks, cfg.block_size, model.num_kv_heads,
                      model.head_dim, cfg.dtype, device, cfg.kv_cache_dtype, *cfg.open_blocks)
    runner = ModelRunner(model, pool, cfg.attention, cfg.block_size, device)
    if cfg.num_host_blocks:
        runner.attach_host_tier(cfg.num_host_blocks)
    return runner
