"""Tensor parallelism over torch.distributed: each rank holds a shard of every layer and its own KV pool.

`LLM(..., tensor_parallel_size=2)` spawns the workers on this machine; under torchrun, rank 0
runs the LLM and every other rank calls `run_worker()` (`nano-infer serve` does both).
"""
from .cleanup import cleanup_dist_env_and_memory
from .driver import driver_shard, start_workers
from .executor import TPExecutor
from .launch import torchrun_launch
from ..config import check_tp_sizes
from .shard import TPShard
from .worker import WorkerConfig, run_worker

__all__ = ["TPExecutor", "TPShard", "WorkerConfig", "check_tp_sizes", "cleanup_dist_env_and_memory", "driver_shard", "run_worker", "start_workers",
           "torchrun_launch"]
