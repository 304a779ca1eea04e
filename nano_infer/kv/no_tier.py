"""The host tier of an engine without one (`kv_offloading_size=0`): it never hits, never offloads, never swaps.

The `KVManager` drives it exactly like a `HostTier`, so its code reads the same with or without chapter 12's
second tier, and without a branch for "no tier".
"""
from __future__ import annotations

from .host_tier import HostTierStats


class NoHostTier:
    num_blocks = 0

    def __init__(self):
        self.pending_in: dict[int, tuple[int, bool]] = {}  # never any: nothing is copied back
        self.stats = HostTierStats()  # only recompute preemptions are ever counted

    def lookup(self, key) -> None:
        return None

    def offload(self, key, device_block: int) -> bool:
        return False  # the evicted block's K/V is simply gone

    def swap_out(self, seq, device_blocks: list[int], keys: list) -> bool:
        return False  # preemption recomputes

    def num_swapped_tokens(self, seq) -> int:
        return 0

    def pin(self, block: int) -> None: ...
    def load(self, seq, block: int, device_block: int) -> None: ...
    def cancel(self, seq, device_block: int) -> None: ...
    def swap_in(self, seq) -> None: ...
    def share(self, parent, child) -> None: ...
    def finish(self, seq) -> None: ...
    def admit(self, seq, num_host_tokens: int) -> None: ...
    def record_admission(self, seq) -> None: ...
    def report(self, request_id: str, metrics, done: bool) -> None: ...

    def take_transfers(self) -> tuple[list, list]:
        return [], []

    def clear(self) -> int:
        return 0
