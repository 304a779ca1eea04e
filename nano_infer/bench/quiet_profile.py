"""torch.profiler without kineto's start and stop lines on stderr; every other line still reaches stderr.

torch 2.13's kineto writes `USDT:<date> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start`
(and `profiler_stop`) straight to file descriptor 2 each time a profile starts and stops: markers for
tracing tools, which in a notebook or a terminal look like errors. No setting hides only them: kineto
prints a message when its severity is at least the level set (KINETO_LOG_LEVEL, or torch's default of
ERROR), and USDT is the highest severity (VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4, USDT 5), so a
level that hides the markers hides kineto's errors too. Here the profile starts and stops with file
descriptor 2 pointed at a temporary file, and what was written there goes back to stderr without the
lines that start with "USDT:".

`top_ops` is the profile's table narrow enough for a notebook: torch's `key_averages().table()` is 139
characters wide with its six columns and a name column padded to the longest name, past the 107 a
JupyterLab output area holds at 1280 px (nano_infer.viz.TEXT_COLUMNS), where each row wraps.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import torch

MARKER = b"USDT:"


@contextlib.contextmanager
def profiled(activities=None, **options):
    """`torch.profiler.profile(activities, **options)` (CPU activity by default) over the block, yielding the
    profiler; kineto's USDT lines are dropped from its start and stop, the block's own output is untouched."""
    prof = torch.profiler.profile(activities=activities or [torch.profiler.ProfilerActivity.CPU], **options)
    with without_usdt_lines():
        prof.start()
    try:
        yield prof
    finally:
        with without_usdt_lines():
            prof.stop()


@contextlib.contextmanager
def without_usdt_lines():
    """Everything written to file descriptor 2 inside the block reaches it afterwards, minus kineto's USDT lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = b"".join(line for line in caught.read().splitlines(keepends=True) if not line.startswith(MARKER))
            while kept:
                kept = kept[os.write(2, kept):]


def top_ops(prof, rows: int = 8, sort_by: str = "self_cpu_time_total"):
    """A pandas frame of the profile's `rows` ops with the most `sort_by` (a FunctionEventAvg attribute, as in
    `key_averages().table(sort_by=...)`): `op`, `self %` (of the ops' own CPU time, torch's "Self CPU %"),
    `self ms`, `total ms` (with the ops it called), `calls`, `µs per call` (total / calls), rounded for reading
    (a tenth of a percent, ms to the µs). About 96 characters wide printed with `to_string(index=False)` where torch's table is 139."""
    import pandas as pd

    ops = prof.key_averages()
    own = sum(e.self_cpu_time_total for e in ops) or 1.0
    top = sorted(ops, key=lambda e: getattr(e, sort_by), reverse=True)[:rows]
    return pd.DataFrame({"op": [e.key for e in top],
                         "self %": [100 * e.self_cpu_time_total / own for e in top],
                         "self ms": [e.self_cpu_time_total / 1e3 for e in top],
                         "total ms": [e.cpu_time_total / 1e3 for e in top],
                         "calls": [e.count for e in top],
                         "µs per call": [e.cpu_time_total / max(1, e.count) for e in top]}
                        ).round({"self %": 1, "self ms": 3, "total ms": 3, "µs per call": 1})
