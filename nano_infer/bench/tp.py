"""Chapter 10's measurements of a tensor-parallel engine: what one decode step sends, and what it costs here.

Both fill the engines with the same steady decode (`profile.decoding`: `num_seqs` sequences at about
`context` tokens) and leave them empty afterwards.

- `collective_calls`: how many times each collective runs in one step, from torch.profiler's events
  on the driver (torch.distributed names them "gloo:all_reduce", "nccl:all_reduce", ...).
- `step_times`: seconds per decode step of a tensor-parallel engine and of a one-process engine,
  taking turns in rounds (`timing.interleaved`), so load from other jobs lands on both alike; then the
  share of the tensor-parallel step the driver spends inside the collectives.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from .profile import decoding
from .quiet_profile import profiled
from .timing import Timings, interleaved

COLLECTIVES = ("gloo:", "nccl:")  # prefixes of torch.distributed's profiler events


def collective_events(prof) -> dict:
    """{name: the profiler's averaged event} for every collective recorded by `prof`."""
    return {e.key: e for e in prof.key_averages() if e.key.startswith(COLLECTIVES)}


def collective_calls(llm, num_seqs: int = 16, context: int = 100) -> dict[str, int]:
    """{collective: calls} in one decode step of `llm`'s driver (rank 0)."""
    with decoding(llm.engine, num_seqs, context), profiled() as prof:
        llm.engine.step()
    return {name: event.count for name, event in collective_events(prof).items()}


@dataclass(frozen=True)
class TPStepTimes:
    """Seconds per decode step of a `tp`-rank engine ("tp=N") and of tp=1 ("tp=1"), one sample per round."""

    tp: int
    timings: Timings
    comm_share: float  # of the driver's wall time per step under the profiler, spent inside the collectives
    threads: int  # torch threads of tp=1 and of each rank on a CPU
    rounds: int
    steps: int  # steps per variant per round

    @property
    def name(self) -> str:
        return f"tp={self.tp}"

    @property
    def step(self) -> float:
        return self.timings.median(self.name)

    @property
    def single(self) -> float:
        return self.timings.median("tp=1")

    @property
    def ratios(self) -> list[float]:
        """tp=N / tp=1 in every round."""
        return self.timings.ratios(self.name, "tp=1")

    @property
    def ratio(self) -> float:
        return self.timings.ratio(self.name, "tp=1")


def step_times(tp_llm, single_llm, rounds: int = 8, steps: int = 5, profiled_steps: int = 10, num_seqs: int = 16,
               context: int = 100) -> TPStepTimes:
    """Decode steps of `tp_llm` and `single_llm` (tp=1) taking turns, `steps` each per round, for `rounds`
    rounds after a warm-up round; then `profiled_steps` more of `tp_llm` under the profiler.

    tp=1 runs in this process, on the torch threads the tensor-parallel engine gave its driver: each
    rank's share of the cores (one thread each on a CPU with no more cores than ranks). So tp=1 is the
    baseline of one rank's compute, which N ranks could at best divide by N. The clock is wall time,
    not `timing`'s CPU time: a tensor-parallel step ends when its slowest rank does, and the driver's
    CPU time leaves out its waits inside the collectives.
    """
    tp = tp_llm.engine.config.tensor_parallel_size
    engines = {f"tp={tp}": tp_llm.engine, "tp=1": single_llm.engine}
    with decoding(tp_llm.engine, num_seqs, context), decoding(single_llm.engine, num_seqs, context):
        per_call = interleaved({name: _steps(engine, steps) for name, engine in engines.items()}, rounds=rounds,
                               warmup=1, clock=time.perf_counter)
        share = _collective_share(tp_llm.engine, profiled_steps)
    per_step = Timings({name: [s / steps for s in samples] for name, samples in per_call.samples.items()})
    return TPStepTimes(tp, per_step, share, torch.get_num_threads(), rounds, steps)


def step_split(times) -> dict[str, tuple[float, float]]:
    """{label: (seconds computing, seconds in collectives)} per step, for `viz.tensor_parallel.step_split_figure`:
    tp=1 from every round of the measurements on the same number of threads, then each tensor-parallel size from
    its own, smallest first."""
    times = sorted(times, key=lambda t: t.tp)
    bars = {}
    for threads in sorted({t.threads for t in times}):
        samples = [s for t in times if t.threads == threads for s in t.timings.samples["tp=1"]]
        bars[f"tp=1, {threads} thread{'s' if threads > 1 else ''}"] = (statistics.median(samples), 0.0)
    bars.update({t.name: (t.step * (1 - t.comm_share), t.step * t.comm_share) for t in times})
    return bars


def _steps(engine, steps: int):
    def run():
        for _ in range(steps):
            engine.step()
    return run


def _collective_share(engine, steps: int) -> float:
    with profiled() as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        wall = time.perf_counter() - start
    return sum(e.cpu_time_total for e in collective_events(prof).values()) / 1e6 / wall
