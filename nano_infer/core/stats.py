"""What the engine publishes after each step for readers on other threads (the HTTP server, its metrics).

The engine's scheduler, KV manager and host tier change on the engine's thread while a step runs; a
reader elsewhere would see them half-way. So the engine builds one immutable `EngineStats` after each
step and swaps it in whole: a reader takes `AsyncLLM.stats` and reads a consistent picture, never the
engine's own objects.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    model_name: str
    max_model_len: int
    num_running: int = 0  # sequences
    num_waiting: int = 0
    kv_usage: float = 0.0  # of the KV pool's blocks, the fraction in use by sequences
    num_kv_blocks: int = 0
    prefix_cache_queries: int = 0  # prompt tokens of admitted requests
    prefix_cache_hits: int = 0  # of those, served from the prefix cache
    num_preemptions: int = 0  # ever
    num_generated_tokens: int = 0  # ever
    host_tier_blocks: int = 0  # 0: no host tier
    host_tier_used: int = 0
    host_tier_offloads: int = 0  # blocks copied device -> host, ever
    host_tier_loads: int = 0  # blocks copied host -> device, ever
