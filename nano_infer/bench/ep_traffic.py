"""What expert parallelism sends between ranks in one MoE layer, counted and timed on gloo (chapter 15).

Two designs put whole experts on each of `world` ranks:
- tensor parallelism (this engine, vLLM's `enable_expert_parallel` under TP): attention leaves every
  token's residual on every rank, so each rank runs the token-expert pairs of its own experts and one
  all-reduce of the layer's output [T, hidden] adds the ranks' partial sums, as for a dense MLP.
- data-parallel attention (DeepSeek's serving, SGLang's and vLLM's DP + EP): each rank holds only its own
  T / world tokens, so a token's row must travel to the ranks of its experts (dispatch, an all-to-all) and
  the experts' outputs travel back (combine, a second all-to-all).

`layer_traffic` counts the bytes each rank sends in one layer either way; `pair_counts` counts the rows of
a dispatch from a real routing; `time_collectives` times both collectives on those sizes with gloo over
the loopback, in two spawned processes, interleaved in rounds (`timing.interleaved`, on the wall clock:
a collective's time is mostly waiting, which CPU time would not count).
"""
from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .timing import Comparison, interleaved


def rank_of_expert(experts: torch.Tensor, num_experts: int, world: int) -> torch.Tensor:
    """The rank holding each expert when each rank holds a contiguous `num_experts / world` of them
    (the engine's cut: rank r holds experts r * E / world .. (r + 1) * E / world - 1)."""
    if num_experts % world:
        raise ValueError(f"num_experts={num_experts} must be a multiple of world={world}: whole experts per rank")
    return experts // (num_experts // world)


def pair_counts(experts: torch.Tensor, token_rank: torch.Tensor, num_experts: int, world: int) -> torch.Tensor:
    """[world, world]: row s, column d = rows rank s sends rank d in a dispatch, one per token-expert pair
    (`experts` [T, k]) whose token lives on rank s (`token_rank` [T]) and whose expert on rank d. The
    diagonal is the pairs whose expert is on the token's own rank: they stay."""
    dst = rank_of_expert(experts, num_experts, world)  # [T, k]
    src = token_rank.unsqueeze(-1).expand_as(dst)
    return torch.bincount((src * world + dst).flatten(), minlength=world * world).reshape(world, world)


def layer_traffic(tokens: int, hidden: int, top_k: int, world: int, value_bytes: int) -> dict[str, float]:
    """Bytes one rank sends in one MoE layer of a step of `tokens` tokens, each design, uniform routing assumed.

    all-reduce (ring): each rank sends 2 (world - 1) / world of the [tokens, hidden] output.
    all-to-all: each rank holds tokens / world tokens with top_k pairs each, of which (world - 1) / world go
    to other ranks' experts: their rows go out in the dispatch and come back in the combine."""
    row = hidden * value_bytes
    all_reduce = 2 * (world - 1) / world * tokens * row
    all_to_all = 2 * (tokens / world) * top_k * (world - 1) / world * row
    return {"all-reduce": all_reduce, "all-to-all": all_to_all}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, steps: dict, hidden: int, top_k: int, dtype: torch.dtype, rounds: int,
          results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        variants, repeats = {}, {}
        for name, counts in steps.items():
            send_splits = counts[rank]  # rows this rank sends each rank in the dispatch
            recv_splits = [counts[s][rank] for s in range(world)]
            tokens = sum(map(sum, counts)) // top_k
            n = repeats[name] = max(2, 4096 // tokens)  # small steps repeated, so a call lasts long enough to time
            dispatched = torch.randn(sum(send_splits), hidden).to(dtype)
            arrived = torch.empty(sum(recv_splits), hidden, dtype=dtype)
            output = torch.randn(tokens, hidden).to(dtype)

            def all_to_all(n=n, dispatched=dispatched, arrived=arrived, send=send_splits, recv=recv_splits):
                for _ in range(n):
                    dist.all_to_all_single(arrived, dispatched, recv, send)  # dispatch
                    dist.all_to_all_single(dispatched, arrived, send, recv)  # combine: the rows go back

            def all_reduce(n=n, output=output):
                for _ in range(n):
                    dist.all_reduce(output)

            variants[(name, "all-to-all")], variants[(name, "all-reduce")] = all_to_all, all_reduce
        # the same variants in the same order on every rank: a collective waits for its partner's call
        timings = interleaved(variants, rounds=rounds, clock=time.perf_counter)
        if rank == 0:
            results.put({k: [s / repeats[k[0]] for s in v] for k, v in timings.samples.items()})
    finally:
        dist.destroy_process_group()


def time_collectives(steps: dict[str, torch.Tensor], hidden: int, top_k: int, dtype: torch.dtype = torch.bfloat16,
                     rounds: int = 7) -> dict[str, Comparison]:
    """For each step (its name -> rows per pair of ranks, from `pair_counts`): one layer's all-to-all dispatch +
    combine against the all-reduce of its [tokens, hidden] output, timed in `world` spawned gloo processes, all
    steps in the same rounds; seconds per layer on rank 0's clock."""
    world = len(next(iter(steps.values())))
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = _free_port()
    env = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # each child starts torch on one thread: the ranks share the cores
    try:
        args = ({k: v.tolist() for k, v in steps.items()}, hidden, top_k, dtype, rounds, results)
        procs = [ctx.Process(target=_rank, args=(r, world, port, *args), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
    finally:
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    samples = results.get()
    return {name: Comparison("all-to-all", "all-reduce", samples[(name, "all-to-all")], samples[(name, "all-reduce")],
                             1.0, "the all-to-all takes longer", "the all-reduce takes longer") for name in steps}
