"""Decode step time against the memory-bandwidth roofline: `python -m nano_infer.bench.decode`.

A decode step at batch 1 reads every weight once and does two FLOPs per weight: far too
little arithmetic per byte for the matmul units to matter. Its limit is memory bandwidth:
a step cannot take less than (weight bytes + K/V bytes read) / bandwidth. This measures
the device's bandwidth in the same run (a large copy, bytes read plus bytes written),
times decode steps at several batch sizes, and prints the fraction of that limit reached.
Larger batches read the same weights for more tokens, which is why tokens/s grows with
the batch until the matmuls, not the reads, take the time.

    python -m nano_infer.bench.decode                                   # the shipped model
    python -m nano_infer.bench.decode --model qwen2.5-1.5b-shape --dtype bfloat16 --seqs 1 8 64 --profile 64
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
from torch import nn

from ..models.packed import PackedLinear
from ..models.quant_formats import Int4Weight, Int8Weight
from ..models.quantization import Int4Linear, Int8Linear
from .presets import model_folder
from .quiet_profile import profiled
from .roofline import decode_throughput, matmul_params
from .timing import sync


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Bytes per second of the best of `repeats` copies of an `nbytes` buffer, counting the read and the write.
    `clock=time.process_time` times it as `timing.interleaved` times the ops it is compared with on a CPU."""
    nbytes = nbytes or (2 << 30 if device.type == "cuda" else 256 << 20)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up (and, on a CPU, the first touch of dst's pages)
        sync()
        start = clock()
        dst.copy_(src)
        sync()
        best = min(best, clock() - start)
    return 2 * nbytes / best


def bytes_per_step(engine, num_seqs: int, context: int) -> tuple[int, int]:
    """(weight bytes, K/V bytes) one decode step must read: every matmul weight once as it is held (float,
    or int4 / int8 with its scales), the LM head included, and each sequence's `context` cached tokens in
    every layer."""
    return matmul_weight_bytes(engine.model), num_seqs * context * engine.kv_bytes_per_token


def matmul_weight_bytes(model) -> int:
    """Bytes of the weights the step multiplies by: each linear layer's weight (int4: its packed nibbles and
    group scales and zeros; int8: its bytes and row scales), and the LM head, which with tied weights and no
    head of its own is the whole embedding matrix. The embedding lookup reads one row a token: left out. An
    int4 layer's dense copy (made for batches, `DenseCopies`) is left out too: a step of few rows reads the int4."""
    held = 0
    for name, module in model.named_modules():
        if isinstance(module, (Int4Linear, Int8Linear)):
            held += sum(b.numel() * b.element_size() for n, b in module.named_buffers(recurse=False) if n != "bias")
        elif isinstance(module, (nn.Linear, PackedLinear)) and not name.endswith(".dense"):
            held += module.weight.numel() * module.weight.element_size()
    if getattr(model, "lm_head", None) is None:
        held += model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    return held


def model_bytes(model) -> int:
    """Bytes the model holds: its parameters, its buffers (int4 nibbles with their scales, dense copies, the
    rotary tables) and the blocks a layer keeps as stored (a GGUF embedding, a Q8_0 head's), each tensor once
    (a tied head's blocks are the embedding's)."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    for module in model.modules():
        for held in vars(module).values():
            if isinstance(held, (Int4Weight, Int8Weight)):
                tensors.update((id(t), t) for t in vars(held).values() if isinstance(t, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def memory_split(engine) -> dict:
    """Bytes of weights (`model_bytes`) and of the KV pool; on a GPU also what the caching allocator has handed
    out (allocated) and holds from the driver (reserved), so the pool's share of the card shows."""
    split = dict(weights=model_bytes(engine.model), kv_pool=engine.kv_pool.nbytes)  # values and scales (int8/fp8 KV)
    if engine.device.type == "cuda":
        split.update(allocated=torch.cuda.memory_allocated(engine.device), reserved=torch.cuda.memory_reserved(engine.device),
                     total=torch.cuda.get_device_properties(engine.device).total_memory)
    return split


def measure(engine, seqs: list[int], context: int, steps: int, bandwidth: float) -> list[dict]:
    rows = []
    for n in seqs:
        decode = decode_throughput(engine, n, context, steps)
        step_s = n / decode["tokens_per_s"]
        weights, kv = bytes_per_step(engine, n, decode["context"])
        rows.append(dict(num_seqs=n, context=decode["context"], step_ms=step_s * 1e3, tokens_per_s=decode["tokens_per_s"],
                         weight_bytes=weights, kv_bytes=kv, read_bytes_per_s=(weights + kv) / step_s,
                         of_bandwidth=(weights + kv) / step_s / bandwidth))
        r = rows[-1]
        print(f"{n:4d} sequences at ~{r['context']} tokens: {r['step_ms']:7.2f} ms per step, {r['tokens_per_s']:8.1f} tok/s; "
              f"reads {weights / 1e9:.3f} GB weights + {kv / 1e9:.3f} GB K/V per step = {r['read_bytes_per_s'] / 1e9:6.1f} GB/s "
              f"= {r['of_bandwidth']:.1%} of the bandwidth", flush=True)
    return rows


def profile_step(engine, num_seqs: int, context: int, steps: int = 3, top: int = 15) -> str:
    """torch.profiler's table of `steps` decode steps of `num_seqs` sequences, ops sorted by their own time on
    the device (kernel time on a GPU, CPU time on a CPU)."""
    from .profile import decoding

    activities = [torch.profiler.ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with decoding(engine, num_seqs, context, seed=2), profiled(activities) as prof:
        for _ in range(steps):
            engine.step()
        sync()
    key = "self_device_time_total" if engine.device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top)


def main(argv=None) -> dict:
    from ..engine.llm_engine import LLMEngine

    p = argparse.ArgumentParser(prog="python -m nano_infer.bench.decode", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default", help="'default' (the shipped model), a bench shape such as "
                   "'qwen2.5-1.5b-shape' (random weights, built offline) or a checkpoint folder")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--seqs", type=int, nargs="+", default=[1, 8, 64], help="batch sizes to time")
    p.add_argument("--context", type=int, default=512, help="tokens already in each sequence's cache")
    p.add_argument("--steps", type=int, default=10, help="timed decode steps per batch size")
    p.add_argument("--profile", type=int, metavar="N", help="also print torch.profiler's table for N sequences")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs: every decode step launched "
                   "kernel by kernel (on a GPU; a CPU always runs eagerly)")
    args = p.parse_args(argv)
    folder, _ = model_folder(args.model)
    engine = LLMEngine(folder, dtype=args.dtype, max_num_seqs=max(args.seqs + [args.profile or 1]),
                       enforce_eager=args.enforce_eager)
    bandwidth = copy_bandwidth(engine.device)
    params = matmul_params(engine.hf_config)  # the config's count: an int4 layer holds buffers, not parameters
    memory = memory_split(engine)
    sizes = ", ".join(f"{name} {n / 2**30:.2f} GiB" if n >= 2**30 else f"{name} {n / 2**20:.1f} MiB"
                      for name, n in memory.items())
    print(f"{args.model}: {params / 1e6:.0f}M matmul params in {str(engine.dtype).removeprefix('torch.')} on {engine.device}; "
          f"copy bandwidth measured now: {bandwidth / 1e9:.0f} GB/s (read + write)\nmemory: {sizes}", flush=True)
    report = dict(model=args.model, dtype=str(engine.dtype), device=str(engine.device), params=params, memory=memory,
                  bandwidth_bytes_per_s=bandwidth, rows=measure(engine, args.seqs, args.context, args.steps, bandwidth))
    if args.profile:
        report["profile"] = profile_step(engine, args.profile, args.context)
        print(f"\nwhere a decode step of {args.profile} sequences goes:\n{report['profile']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
