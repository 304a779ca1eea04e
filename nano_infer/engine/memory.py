"""Memory accounting: KV bytes reserved vs. bytes that hold real tokens, per engine step.

"Reserved" is what the cache has set aside: every allocated block (or, for the
contiguous cache, every sequence's whole max-length region). "Used" is the part that
holds a token's K/V. Their ratio is the chapter 01/02 number: how much of the KV memory
does real work. On CUDA the allocator's own figures are recorded too.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..core.plugin import EnginePlugin, Phase, StepContext


@dataclass
class StepRecord:
    step: int
    start: float
    end: float
    scheduled: list[tuple[str, int, int, str]]  # (request_id, sample index, tokens, "prefill" | "decode")
    num_running: int
    num_waiting: int
    num_preempted: int
    kv_reserved_bytes: int
    kv_used_bytes: int
    num_free_blocks: int
    num_cached_blocks: int
    block_tables: dict[str, list[int]] = field(default_factory=dict)  # "request_id/index" -> blocks
    ref_counts: list[int] = field(default_factory=list)
    cuda_allocated: int | None = None
    cuda_max_allocated: int | None = None

    @property
    def kv_utilization(self) -> float:
        return self.kv_used_bytes / self.kv_reserved_bytes if self.kv_reserved_bytes else 1.0


def kv_usage(kv, running, bytes_per_token: int) -> tuple[int, int]:
    """(reserved, used) bytes of a KVManager. A block shared by several sequences counts once."""
    if kv is None:
        return 0, 0
    bs = kv.block_size
    filled: dict[int, int] = {}
    for seq in running:
        for i, block in enumerate(seq.block_table):
            n = min(bs, max(0, seq.num_computed_tokens - i * bs))
            filled[block] = max(filled.get(block, 0), n)
    if kv.prefix_cache is not None:  # idle cached blocks (only the cache's reference) are full and still reserved
        for block in range(kv.num_blocks):
            if kv.ref_count[block] == 1 and kv.holds(block):
                filled[block] = bs
    reserved = (kv.num_blocks - kv.num_free_blocks) * bs * bytes_per_token
    return reserved, sum(filled.values()) * bytes_per_token


class StepRecorder(EnginePlugin):
    """Opt-in (`LLM(record_steps=True)`): one StepRecord per engine step, for the plots."""

    phase = Phase.OBSERVE  # after speculation: what each entry computes includes its proposals

    def __init__(self, kv, scheduler, bytes_per_token: int):
        self.kv = kv  # the KVManager (or None): blocks, reference counts, the prefix cache
        self.scheduler = scheduler  # the running and waiting queues
        self.bytes_per_token = bytes_per_token
        self.records: list[StepRecord] = []
        self._scheduled: list[tuple[str, int, int, str]] = []

    def adjust(self, step: StepContext) -> None:
        """Note what each entry computes before the step runs (after the proposals are in): a
        decode computes the K/V of a generated token (and of the tokens proposed after it)."""
        self._scheduled = [(e.seq.request_id, e.seq.index, e.num_tokens, e.kind) for e in step.batch.scheduled]

    def after_step(self, step: StepContext) -> None:
        kv, sched, cuda = self.kv, self.scheduler, step.runner.device.type == "cuda"
        reserved, used = kv_usage(kv, sched.running, self.bytes_per_token)
        self.records.append(StepRecord(
            step=len(self.records), start=step.start, end=time.perf_counter(), scheduled=self._scheduled,
            num_running=len(sched.running), num_waiting=len(sched.waiting), num_preempted=len(step.batch.preempted),
            kv_reserved_bytes=reserved, kv_used_bytes=used,
            num_free_blocks=kv.num_free_blocks if kv else 0,
            num_cached_blocks=kv.prefix_cache.num_cached_blocks() if kv and kv.prefix_cache else 0,
            block_tables={f"{s.request_id}/{s.index}": list(s.block_table) for s in sched.running},
            ref_counts=list(kv.ref_count) if kv else [],
            cuda_allocated=torch.cuda.memory_allocated() if cuda else None,
            cuda_max_allocated=torch.cuda.max_memory_allocated() if cuda else None,
        ))
