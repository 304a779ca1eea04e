"""Timings that reproduce on a busy machine: variants interleaved in rounds, medians of paired ratios.

Another process on a shared CPU slows torch several-fold for seconds at a time, so two variants
timed one after the other can see different machines. Here every round runs each variant once,
in a rotated order, so a burst of load lands on all of them alike; the first `warmup` rounds are
thrown away (allocator, caches, lazy init). A comparison prints the two medians and their ratio, so
a reader can recompute it from the numbers beside it; its verdict comes from the per-round ratios,
which all lie on one side of the threshold or make it "inconclusive". (If every round's ratio is
above a threshold, so is the ratio of the medians: the medians cannot contradict the verdict.) On CPU the clock is the process's CPU time, which does not count the moments
a neighbour holds the core (it still feels a neighbour sharing caches and memory bandwidth).
`one_thread()` is for CPU timings: a neighbour taking one of two cores slows a one-thread op
at most twice, a two-thread op (which waits for its slower thread at every barrier) far more,
and a waiting thread's spinning would count as CPU time.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class Timings:
    """Seconds per call of each variant, one sample per round, rounds aligned across variants."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def ratios(self, slow: str, fast: str) -> list[float]:
        """slow / fast in every round, both timed in the same round."""
        return [s / f for s, f in zip(self.samples[slow], self.samples[fast])]

    def ratio(self, slow: str, fast: str) -> float:
        """The median of slow over the median of fast: the ratio of the two numbers a table prints beside it.
        It lies between the smallest and the largest per-round ratio."""
        return self.median(slow) / self.median(fast)

    def compare(self, slow: str, fast: str, threshold: float = 1.0, above: str = "", below: str = "") -> Comparison:
        return Comparison(str(slow), str(fast), self.samples[slow], self.samples[fast], threshold, above, below)


@dataclass
class Comparison:
    """Two variants timed in the same rounds, said one way in every chapter:
    "slow 12.30 ms / fast 4.10 ms = 3.00x (rounds 2.80-3.40) -> verdict". The ratio is the medians' (what a
    reader recomputes from the line), the range and the verdict are the rounds' (tests/test_notebook_ratios.py
    recomputes every such line of the committed notebooks)."""

    slow_name: str
    fast_name: str
    slow: list[float]  # seconds (or any unit `scale` turns into the printed one), one per round
    fast: list[float]
    threshold: float = 1.0
    above: str = ""  # the verdict when every round's ratio is above the threshold
    below: str = ""
    over: str = "rounds"  # what the pairs are: rounds, or requests served by both

    @property
    def ratios(self) -> list[float]:
        return [s / f for s, f in zip(self.slow, self.fast)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.slow) / statistics.median(self.fast)

    @property
    def verdict(self) -> str:
        return verdict(self.ratios, self.threshold, self.above, self.below)

    def text(self, unit: str = "ms", scale: float = 1e3, digits: int = 2) -> str:
        a, b = (statistics.median(x) * scale for x in (self.slow, self.fast))
        line = (f"{self.slow_name} {a:,.{digits}f} {unit} / {self.fast_name} {b:,.{digits}f} {unit} = {a / b:.2f}x "
                f"({self.over} {min(self.ratios):.2f}-{max(self.ratios):.2f})")
        return f"{line} -> {self.verdict}" if self.above or self.below else line


def verdict(ratios: list[float], threshold: float, above: str, below: str) -> str:
    """`above` when every round's ratio is above `threshold`, `below` when every one is below it,
    else "inconclusive": the rounds straddle the threshold, so the median alone would flip between
    reruns (a busy machine does that)."""
    if min(ratios) > threshold:
        return above
    if max(ratios) < threshold:
        return below
    return "inconclusive"


def sync() -> None:
    """Wait for queued GPU work, so a timer read after it counts that work (a no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def default_clock() -> Callable[[], float]:
    """CPU time of this process on CPU (time a neighbour takes the core away does not count), wall time on GPU."""
    return time.perf_counter if torch.cuda.is_available() else time.process_time


def interleaved(variants: dict, rounds: int = 7, warmup: int = 1, setup: Callable[[object], object] | None = None,
                clock: Callable[[], float] | None = None) -> Timings:
    """Time each `fn()` once per round, variants in turn (order rotated every round); seconds per call.

    `setup(name)`, if given, runs untimed right before each call of variant `name` (e.g. the
    prefill before a timed decode step). `clock` defaults to `default_clock()`.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    clock = clock or default_clock()
    names = list(variants)
    timings = Timings({name: [] for name in names})
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if setup is not None:
                setup(name)
            sync()
            start = clock()
            variants[name]()
            sync()
            if r >= warmup:
                timings.samples[name].append(clock() - start)
    return timings


@contextlib.contextmanager
def one_thread():
    """torch on one CPU thread inside the block (GPU work is unaffected), the old setting restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
