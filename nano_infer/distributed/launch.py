"""Joining the tensor-parallel process group: local ranks on a free port, or torchrun's rendezvous.

Three groups over the same ranks, each with the timeout its job needs:
- the default group (gloo) meets once at start-up: rendezvous, then a barrier once every rank has
  loaded its shard. `STARTUP_TIMEOUT_S` bounds both.
- the step group, on the device's backend (gloo for CPU tensors, NCCL for CUDA ones), carries the
  forward's all-reduces and the logits gather. Its timeout (`distributed_timeout`) bounds how long
  a step waits for a rank that died or hung: the step fails instead of hanging.
- the message group (gloo) carries the driver's messages: each step's inputs, then stop. A worker
  waits on it between steps for as long as the server sits idle, so its timeout there is long.
  The driver's is `distributed_timeout`: gloo sends a message only once the receiver is ready to
  take it, so a hung worker would otherwise stall the driver in the send. (A timeout belongs to
  each process's handle on a group, so the two ends may differ.)
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

IDLE_TIMEOUT = timedelta(days=7)  # a worker waiting for the next step: an idle server is not a fault
STARTUP_TIMEOUT_S = 600  # every rank imports torch and loads its shard of the weights before the first step


@dataclass(frozen=True)
class Launch:
    """Where this process sits in the job: its rank, the world, and how to find rank 0."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    init_method: str


def torchrun_launch() -> Launch | None:
    """The job torchrun (or any launcher setting its variables) started this process in; None outside one."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    world = int(env["WORLD_SIZE"])
    return Launch(int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])),
                  int(env.get("LOCAL_WORLD_SIZE", world)), "env://")


def local_launch(world_size: int) -> Launch:
    """Rank 0 of a job whose workers this process spawns on this machine: a free port on the loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return Launch(0, world_size, 0, world_size, f"tcp://127.0.0.1:{port}")


def default_backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_groups(launch: Launch, backend: str, timeout_s: float):
    """Join the job; return (message group, step group). `timeout_s` bounds every wait of the driver
    (rank 0) and a worker's waits inside a step."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"distributed_backend={backend!r} is invalid: use 'gloo' (CPU) or 'nccl' (CUDA)")
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group is already running in this process "
                           "(another tensor-parallel LLM?): close it first")
    dist.init_process_group("gloo", init_method=launch.init_method, rank=launch.rank,
                            world_size=launch.world_size, timeout=timedelta(seconds=STARTUP_TIMEOUT_S))
    messages = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s) if launch.rank == 0 else IDLE_TIMEOUT)
    steps = dist.new_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return messages, steps


def broadcast_message(obj, messages):
    """Rank 0's `obj` (a StepInput, the worker config, or None to stop) on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=messages)
    return box[0]
