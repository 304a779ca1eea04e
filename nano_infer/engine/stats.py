"""What the engine publishes after each step for readers on other threads (the HTTP server, its metrics).

The engine's scheduler, KV manager and host tier change on the engine's thread while a step runs; a
reader on another thread would see them half-way through. So after each step the engine builds one
immutable `EngineStats` and swaps it in whole (`LLMEngine.stats`, one attribute assignment): a reader
takes the record and reads a consistent picture, never the engine's own objects.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..kv.host_tier import HostTierStats
from ..prefix.base import PrefixCacheStats
from .request_stats import RequestStatsSnapshot


@dataclass(frozen=True)
class HostTierSnapshot:
    """The host tier (chapter 12): its blocks, and what moved each way since the start."""

    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int  # holding an offloaded prefix block
    stats: HostTierStats  # a copy: hits, blocks offloaded, loaded, swapped, dropped, preemptions by kind
    bytes_to_host: int
    bytes_to_device: int


@dataclass(frozen=True)
class EngineStats:
    model_name: str  # what clients call the model: a hub id, a GGUF file's name or a local folder's name
    max_model_len: int
    num_running: int = 0  # sequences in the running batch
    num_waiting: int = 0  # sequences waiting to be admitted
    num_steps: int = 0
    num_generated_tokens: int = 0
    num_forward_tokens: int = 0  # tokens computed by the model (prompt chunks and decode inputs)
    num_kv_blocks: int = 0  # 0: no KV cache (kv_cache="none")
    num_free_kv_blocks: int = 0
    prefix_cache: PrefixCacheStats | None = None  # a copy; None without a prefix cache
    host_tier: HostTierSnapshot | None = None  # None without a host tier
    requests: RequestStatsSnapshot = RequestStatsSnapshot()  # latencies and counts of requests (request_stats.py)

    @property
    def kv_usage(self) -> float:
        """The fraction of the KV pool's blocks held by sequences or the prefix cache."""
        return (self.num_kv_blocks - self.num_free_kv_blocks) / self.num_kv_blocks if self.num_kv_blocks else 0.0


def copy_of(stats: PrefixCacheStats | HostTierStats) -> PrefixCacheStats | HostTierStats:
    """A copy that the engine's later steps do not change."""
    return dataclasses.replace(stats)
