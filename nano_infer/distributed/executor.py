"""TPExecutor: the driver's side of tensor parallelism (rank 0: scheduler, sampler, API, and one shard).

Each step the driver sends the packed `StepInput` to every worker, then runs its own shard of the
forward; the ranks meet in the all-reduces and the driver gathers the logits. Faults end in a
clear RuntimeError, never a silent hang:
- before each step the driver checks that its spawned workers are alive;
- a worker that dies mid-step breaks the collective at once (its sockets close); one that hangs
  makes the collective time out after `timeout_s`;
- after a failure (or Ctrl-C in the middle of a step, which leaves the ranks out of step) the
  executor stops every worker and refuses further steps: create a new LLM.
`shutdown()` (LLM.close, garbage collection, interpreter exit) stops the workers: a message,
then terminate, then kill. Workers also exit on their own if the driver process disappears.
"""
from __future__ import annotations

import os
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .launch import broadcast_message, init_groups, local_launch, torchrun_launch
from .shard import TPShard
from .worker import WorkerConfig, spawned_worker


class TPExecutor:
    def __init__(self, shard: TPShard, worker_config: WorkerConfig, backend: str, timeout_s: float):
        """Start the workers (spawned here, or already started by torchrun), meet them, and give the
        driver's `shard` its step group."""
        world_size = self.world_size = shard.world_size
        self.timeout_s = timeout_s
        self.error: str | None = None
        self.closed = False
        launch = torchrun_launch() or local_launch(world_size)
        self.procs = []
        self._threads_before = torch.get_num_threads()
        if worker_config.num_threads:
            torch.set_num_threads(worker_config.num_threads)
        if launch.init_method != "env://":  # spawn the workers of this machine
            ctx = mp.get_context("spawn")
            for rank in range(1, world_size):
                p = ctx.Process(target=spawned_worker, daemon=True, name=f"nano-infer-tp-rank{rank}",
                                args=(rank, world_size, launch.init_method, backend, timeout_s, os.getpid()))
                p.start()
                self.procs.append(p)
        self.messages = None
        self._finalizer = weakref.finalize(self, _stop, self.procs, None, self._threads_before)
        try:
            self.messages, shard.group = init_groups(launch, backend, timeout_s)
        except BaseException:
            self._finalizer()
            raise
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.messages, self._threads_before)
        try:
            broadcast_message(worker_config, self.messages)
            dist.barrier()  # every worker has loaded its shard and built its KV pool
        except BaseException as e:
            raise self._fail(e, "start-up") from e

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def run(self, step, execute):
        """Send `step` to the workers, run `execute(step)` here; the logits come back on the driver."""
        if self.error or self.closed:
            raise RuntimeError(self.error or "tensor-parallel workers are shut down (LLM closed)")
        if any(p.exitcode is not None for p in self.procs):
            raise self._fail(None, "step")
        try:
            broadcast_message(step, self.messages)
            return execute(step)
        except Exception as e:
            raise self._fail(e, "step") from e
        except BaseException as e:  # Ctrl-C mid-step: the workers are left mid-collective
            self._fail(e, "step")
            raise

    def shutdown(self) -> None:
        """Stop every worker and leave the process group; safe to call twice."""
        self.closed = True
        self._finalizer()

    # -- faults ----------------------------------------------------------------------------------
    def _fail(self, error: BaseException | None, when: str) -> RuntimeError:
        for p in self.procs:  # a worker that died is reaped here; one that hangs stays alive
            p.join(timeout=1)
        if isinstance(error, KeyboardInterrupt):
            cause = "interrupted mid-step (the ranks are out of step)"
        elif error is None:
            cause = "a worker process is gone"
        elif "timed out" in str(error).lower():
            cause = f"a collective timed out after {self.timeout_s:g} s"
        else:
            cause = f"a collective failed ({type(error).__name__}: {error})"
        states = [f"worker rank {r} (pid {p.pid}) " + (f"exited with code {p.exitcode}" if p.exitcode is not None
                                                         else "is still running (hung, or waiting on another rank)")
                  for r, p in enumerate(self.procs, start=1)]
        self.error = f"tensor-parallel {when} failed: {cause}; {'; '.join(states) or 'no local workers'}. " \
                     f"The workers are stopped; create a new LLM."
        self._finalizer.detach()  # no goodbye message: the group is broken
        _stop(self.procs, self.messages, self._threads_before, graceful=False)
        self.closed = True
        return RuntimeError(self.error)


def _stop(procs, messages, threads_before: int, graceful: bool = True) -> None:
    """Tell the workers to exit (when the group still works), then make sure they did, then leave the group."""
    if graceful and messages is not None:
        try:
            broadcast_message(None, messages)
        except Exception:  # noqa: BLE001 - a broken group: the processes are stopped below
            graceful = False
    for p in procs:
        p.join(timeout=10 if graceful else 0)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join()
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.set_num_threads(threads_before)
