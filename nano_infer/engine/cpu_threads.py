"""On a CPU, the engine's intra-op threads follow the cores other processes leave free.

torch runs each op on all its threads and waits for the slowest. When another process holds a core,
the thread that shares it runs a fraction of the time and every op waits for it, so a step on every
core can take longer than a step on the cores left. Between steps, at most every CHECK_S seconds, this
plug-in reads how much CPU time the other processes took (/proc/stat's busy time less this process's
own) and sets torch's threads to the cores left: never more than torch had when the engine started or
was last set to by anyone else (a chapter's cell that pins one thread keeps one), never fewer than one.
What the others did while the engine waited for work says little of what they do when it resumes (a
benchmark's other engine, a burst in a browser): the first step after a wait starts a new interval,
counted soon after.
Threads and child processes of this process (a server's tokenizer, its HTTP loop, the worker processes
inductor compiles in) are its own load, not another's. Linux only; with tensor-parallel workers (processes
of its own) the engine keeps torch's setting.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ..core.plugin import EnginePlugin, StepContext

CHECK_S = 1.0  # how often the free cores are counted: a step is milliseconds, another process's load lasts longer
IDLE_S = 0.25  # no step for this long: the engine waited for work
RECHECK_S = 0.1  # the first count after a wait: short, and long enough for /proc/stat's 10 ms ticks
STAT = Path("/proc/stat")
# a core counts as taken when other processes used more than this share of it over the last interval
TAKEN = 0.5


def busy_seconds() -> float:
    """CPU seconds every process has spent busy since boot (all cores): /proc/stat's first line."""
    fields = STAT.read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and of every process it started, directly or through another: those still
    running read from /proc (each with the time of the processes it waited for: a compile worker's g++ runs),
    those this process waited for from os.times()."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    pending, tick = _children(os.getpid()), os.sysconf("SC_CLK_TCK")
    while pending:
        pid = pending.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:  # ended since it was listed
            continue
        total += sum(int(f) for f in fields[11:15]) / tick  # its time and that of the processes it waited for
        pending += _children(pid)
    return total


def _children(pid: int) -> list[int]:
    """The processes `pid`'s threads started, still running."""
    pids = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids += [int(c) for c in children.read_text().split()]
        except OSError:
            continue
    return pids


class FreeCoreThreads(EnginePlugin):
    def __init__(self, max_threads: int, cores: int):
        self.max_threads, self.cores = max_threads, cores
        self.threads = max_threads
        self.changes = 0  # how often the count changed (a test reads it)
        self._last = self._sample()
        self._due = self._stepped = self._last[0]  # the next count; the end of the last step

    @classmethod
    def for_cpu(cls) -> "FreeCoreThreads | None":
        """The plug-in, when there is a /proc/stat to read and more than one thread to share out."""
        if not STAT.exists() or torch.get_num_threads() < 2:
            return None
        return cls(torch.get_num_threads(), os.cpu_count() or 1)

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        return time.monotonic(), busy_seconds(), own_seconds()

    def adjust(self, step: StepContext) -> None:
        now = time.monotonic()
        if now - self._stepped >= IDLE_S:  # back from a wait: the interval starts here
            self._last, self._due = self._sample(), now + RECHECK_S
        elif now >= self._due:
            self.update(self._sample())
            self._due = now + CHECK_S

    def after_step(self, step: StepContext) -> None:
        self._stepped = time.monotonic()

    def update(self, now: tuple[float, float, float]) -> None:
        """Set the threads from the other processes' CPU use between the last sample and `now`."""
        (wall0, busy0, own0), (wall1, busy1, own1) = self._last, now
        self._last = now
        if torch.get_num_threads() != self.threads:  # set by someone else since (a cell pinning one): it caps ours
            self.max_threads = self.threads = torch.get_num_threads()
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / max(wall1 - wall0, 1e-9)  # cores' worth
        taken = int(others + (1 - TAKEN))  # cores the others hold more than TAKEN of
        threads = max(1, min(self.max_threads, self.cores - taken))
        if threads != self.threads:
            self.threads, self.changes = threads, self.changes + 1
            torch.set_num_threads(threads)
