"""The driver's (rank 0's) side of starting tensor parallelism, called by LLMEngine before and after loading.

Before the weights: which shard rank 0 holds, and on which device (under torchrun, its local
rank's GPU). After the KV pool is sized: start the workers with the same pool shape, so a block
id means the same slots on every rank.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import EngineConfig
from .executor import TPExecutor
from .launch import Launch, default_backend, torchrun_launch
from .shard import TPShard
from .worker import StepExecutor, WorkerConfig


def driver_shard(size: int, device: torch.device,
                 expert_parallel: bool = False) -> tuple[TPShard | None, Launch | None, torch.device]:
    """(rank 0's shard, the torchrun job or None, rank 0's device); no shard for one process."""
    if size == 1:
        return None, None, device
    launch = torchrun_launch()
    if launch is not None:
        if launch.world_size != size:
            raise ValueError(f"tensor_parallel_size={size} but torchrun started WORLD_SIZE={launch.world_size} ranks")
        if launch.rank != 0:
            raise ValueError(f"this is rank {launch.rank} of a torchrun job: rank 0 runs the LLM, the others "
                             f"call nano_infer.distributed.run_worker()")
    if device.type == "cuda":
        device = torch.device("cuda", launch.local_rank if launch else 0)
        torch.cuda.set_device(device)
    return TPShard(0, size, expert_parallel=expert_parallel), launch, device


def start_workers(cfg: EngineConfig, shard: TPShard, launch: Launch | None,
                  build_runner: Callable[[WorkerConfig, TPShard, torch.device], StepExecutor], model: str,
                  dtype: torch.dtype, device: torch.device, max_model_len: int, num_blocks: int | None, block_size: int,
                  num_host_blocks: int = 0, open_blocks: tuple[int, int] = (0, 1)) -> TPExecutor:
    """Spawn (or meet torchrun's) workers; each loads its shard of `model` and a pool of `num_blocks` with
    `build_runner` (the engine's `worker_runner`)."""
    local_ranks = launch.local_world_size if launch else cfg.tensor_parallel_size
    threads = max(1, torch.get_num_threads() // local_ranks) if device.type == "cpu" else None
    worker = WorkerConfig(build_runner=build_runner, model=model, dtype=dtype, device_type=device.type,
                          max_model_len=max_model_len, num_blocks=num_blocks, num_host_blocks=num_host_blocks,
                          block_size=block_size, attention=cfg.attention,
                          kv_cache_dtype=cfg.kv_cache_dtype, open_blocks=open_blocks, num_threads=threads,
                          expert_parallel=shard.expert_parallel)
    return TPExecutor(shard, worker, cfg.distributed_backend or default_backend(device.type), cfg.distributed_timeout)
