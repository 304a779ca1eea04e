"""A tensor-parallel worker: its shard of the model, its own KV pool, and a loop that runs the driver's steps.

The worker has no scheduler, no sampler and no tokenizer. It waits for the driver's next
`StepInput` (token ids, positions, slot mapping, block tables, copy-on-write copies), runs the
same `ModelRunner.execute` as the driver on it, joining the forward's all-reduces and the
logits gather, and waits again, until the driver sends None.

What the worker runs the steps on comes in the `WorkerConfig`: `build_runner`, a function the driver
names (the engine's `worker_runner`, engine/tp_worker.py), unpickled here by its module and name. So
this package starts processes and moves messages, and knows nothing of the engine above it.

Local workers are spawned by the driver (`TPExecutor`); under torchrun every rank other than 0
calls `run_worker()`.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from ..core.batch import BlockSwap, StepInput
from .launch import Launch, broadcast_message, default_backend, init_groups, torchrun_launch
from .shard import TPShard


class StepExecutor(Protocol):
    """What a worker runs the driver's messages on (the engine's ModelRunner)."""

    def execute(self, step: StepInput) -> None: ...
    def apply_swap(self, moves: BlockSwap) -> None: ...


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to build its shard; sent by the driver once the group is up."""

    # builds the worker's runner on its shard: (this config, the shard, the device) -> the runner
    build_runner: Callable[[WorkerConfig, TPShard, torch.device], StepExecutor]
    model: str  # a local folder or a hub id, resolved on the worker's machine
    dtype: torch.dtype
    device_type: str  # "cpu" or "cuda" (a worker uses cuda:LOCAL_RANK)
    max_model_len: int
    num_blocks: int | None  # KV pool: same block ids as the driver's BlockManager (None: no cache)
    num_host_blocks: int  # the rank's own host tier (chapter 12), same block ids as the driver's HostTier; 0: none
    block_size: int
    attention: str
    kv_cache_dtype: str  # how the rank's pool stores its heads' K/V (each rank quantizes its own, scales included)
    open_blocks: tuple[int, int]  # (rows, ring) of exact open blocks beside an 8-bit pool, the driver's row ids
    num_threads: int | None  # torch threads per rank on a CPU
    expert_parallel: bool = False  # a Mixture-of-Experts model's experts cut whole (see shard.py)


def run_worker(device: str | None = None, backend: str | None = None, timeout_s: float = 300.0) -> None:
    """Serve as a worker in a torchrun job until the driver (rank 0) stops; for ranks other than 0.

        torchrun --nnodes 2 --nproc-per-node 1 ... -m nano_infer serve --tensor-parallel-size 2
    calls this on rank 1 for you. `device`, `backend` and `timeout_s` must match the driver's
    `device`, `distributed_backend` and `distributed_timeout` (defaults: CUDA when present, NCCL
    on CUDA and gloo on CPU, 300 s).
    """
    launch = torchrun_launch()
    if launch is None or launch.rank == 0:
        raise RuntimeError("run_worker() is for ranks 1.. of a torchrun job (RANK, WORLD_SIZE, MASTER_ADDR, "
                           "MASTER_PORT set); rank 0 runs the LLM")
    device_type = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type
    serve(launch, backend or default_backend(device_type), timeout_s)


def spawned_worker(rank: int, world_size: int, init_method: str, backend: str, timeout_s: float, parent_pid: int):
    """Entry point of a worker process the driver spawned on this machine."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the driver decides
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    try:
        serve(Launch(rank, world_size, rank, world_size, init_method), backend, timeout_s)
    except BaseException:  # noqa: BLE001 - report, then exit non-zero: the driver sees the exit code
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _exit_with_parent(parent_pid: int) -> None:
    """If the driver dies without stopping us (killed, crashed), exit too: never an orphan."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def serve(launch: Launch, backend: str, timeout_s: float) -> None:
    messages, steps = init_groups(launch, backend, timeout_s)
    try:
        cfg: WorkerConfig = broadcast_message(None, messages)
        device = torch.device("cpu")
        if cfg.device_type == "cuda":
            device = torch.device("cuda", launch.local_rank)
            torch.cuda.set_device(device)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        runner = cfg.build_runner(cfg, TPShard(launch.rank, launch.world_size, steps, cfg.expert_parallel), device)
        dist.barrier()  # ready: the driver's start-up waits for every rank here
        while (step := broadcast_message(None, messages)) is not None:
            (runner.apply_swap if isinstance(step, BlockSwap) else runner.execute)(step)
    finally:
        dist.destroy_process_group()
