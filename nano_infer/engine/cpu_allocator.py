"""On a CPU, keep the memory a step frees inside the process for the next step.

glibc's malloc serves a large request with a fresh mapping from the OS and unmaps it when the
tensor dies, so the next step faults every 4 KiB page in again, and the OS zeroes each one. Its
threshold for "large" rises with what is freed, but never above 32 MiB, so a long prefill step's
bigger tensors are mapped afresh on every step, and each of their pages faulted in again. With
the thresholds below raised the faults all but vanish and the step is faster (the README's CPU-path
list has the counts): freed blocks stay in malloc's heap and are reused. The price is that the process
keeps its peak activation memory until it exits, as vLLM's CPU backend does by preloading tcmalloc.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 1 << 30) and mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
