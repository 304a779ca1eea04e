"""Time and memory of one attention call, gather vs blockwise, against context length.

The case is built the way the engine builds it: a paged KV pool, sequences whose block
tables point at shuffled blocks, and `ModelRunner.prepare` to turn them into the step's
metadata (slot mapping, padded decode block tables, masks). Only the model is missing: q, k and v
are random, since attention cost does not depend on their values.

Peak memory is the most bytes the call holds in temporaries at once: on CUDA from the
allocator's high-water mark, on CPU from the profiler's allocation events replayed in order.
"""
from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import dataclass

import torch

from ..models.attention import AttentionBackend
from ..kv import KVPool
from ..engine.model_runner import ModelRunner
from ..sampling_params import SamplingParams
from ..core.batch import ScheduledSeq
from ..core.sequence import Sequence
from ..core.utils import cdiv
from .timing import interleaved


@dataclass
class StepCase:
    """One packed step, ready to run: `case()` is one layer's attention call."""

    backend: AttentionBackend
    q: torch.Tensor  # [T, num_heads, head_dim]: every new token of every sequence, packed
    k: torch.Tensor  # [T, num_kv_heads, head_dim]: the step's new keys (attend writes them into the pool)
    v: torch.Tensor
    seqs: list[Sequence]  # block tables and positions, as the engine keeps them
    num_new: list[int]  # tokens each sequence computes in this step
    first_rows: list[int]  # where each sequence's new tokens start in q (the runner packs decodes first)

    def __call__(self) -> torch.Tensor:
        return self.backend.attend(0, self.q, self.k, self.v)


def step_case(impl: str, work: list[tuple[int, int]], num_heads: int, num_kv_heads: int, head_dim: int,
              block_size: int = 16, blocks_per_chunk: int = 16, dtype=torch.float32, device="cpu", seed: int = 0) -> StepCase:
    """work: (tokens already cached, tokens computed now) per sequence: (n - 1, 1) is a decode."""
    device = torch.device(device)
    blocks = [cdiv(cached + new, block_size) for cached, new in work]
    pool = KVPool(1, sum(blocks), block_size, num_kv_heads, head_dim, dtype, device)
    gen = torch.Generator(device).manual_seed(seed)
    pool.tensor.normal_(generator=gen)
    free = list(range(pool.num_blocks))
    random.Random(seed).shuffle(free)  # a real pool is fragmented: a sequence's blocks are anywhere
    seqs = []
    for (cached, new), nb in zip(work, blocks):
        seq = Sequence("bench", [0] * (cached + new), SamplingParams(max_tokens=1))
        seq.block_table = [free.pop() for _ in range(nb)]
        seq.num_computed_tokens = cached
        seqs.append(seq)
    runner = ModelRunner(None, pool, impl, block_size, device)
    runner.backend.blocks_per_chunk = blocks_per_chunk
    _, _, meta, last_rows = runner.prepare([ScheduledSeq(seq, cached, new) for seq, (cached, new) in zip(seqs, work)])
    runner.backend.meta = meta
    T = sum(new for _, new in work)

    def rand(heads):
        return torch.randn(T, heads, head_dim, generator=gen, device=device, dtype=dtype)

    num_new = [new for _, new in work]
    first_rows = [last - new + 1 for last, new in zip(last_rows, num_new)]  # every sequence reaches its end
    return StepCase(runner.backend, rand(num_heads), rand(num_kv_heads), rand(num_kv_heads), seqs, num_new, first_rows)


def peak_bytes(fn, device="cpu") -> int:
    """Most bytes of temporaries alive at once while `fn` runs (its result included)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side logs every start and stop to file descriptor 2 (no setting turns it off)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def attention_scaling(contexts: list[int], batch: int, num_heads: int, num_kv_heads: int, head_dim: int,
                      impls=("gather", "blockwise"), dtype=torch.float32, device="cpu", repeats: int = 7,
                      **case_options) -> list[dict]:
    """For each context length and variant: ms per decode attention call (`batch` sequences that long, one
    new token each), its time relative to the first variant, and peak MiB of temporaries.

    The variants take turns call by call (`timing.interleaved`, one warm-up round, `repeats` timed
    rounds): `ms` is the median, `ratio` the median over rounds of this variant's time over the
    first variant's in the same round (`ratios`: every round's), so a burst of load on the machine
    hits both alike.
    """
    rows = []
    for context in contexts:
        cases = {impl: step_case(impl, [(context - 1, 1)] * batch, num_heads, num_kv_heads, head_dim, dtype=dtype,
                                 device=device, **case_options) for impl in impls}
        timings = interleaved(cases, rounds=repeats, warmup=1)
        rows += [dict(impl=impl, context=context, ms=1e3 * timings.median(impl), ratio=timings.ratio(impl, impls[0]),
                      ratios=timings.ratios(impl, impls[0]), mib=peak_bytes(case, device) / 2**20)
                 for impl, case in cases.items()]
    return rows
