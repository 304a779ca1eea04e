"""Prometheus metrics of a running engine, read at scrape time (GET /metrics).

Two sets of names, side by side, read from the same record in the same scrape: vLLM's `vllm:*` series
(engine/vllm_metrics.py: its names, labels `model_name` and `engine`, and its latency histograms' buckets),
so a vLLM dashboard or alert rule points here unchanged; and the `nano_infer_` series, which name what vLLM
has no series for (KV blocks, the host tier, forward tokens, steps, the server's 500s and hang-ups) and
which chapter 08 and the chapter 12 tests read.
Nothing is counted twice: gauges and counters are read, when Prometheus scrapes, from the
`EngineStats` the engine published after its last step (engine/stats.py), through a custom
collector: never from the engine's own objects, which its thread is changing.
Token throughput is a counter; Prometheus turns it into tokens/s:
`rate(nano_infer_generation_tokens_total[1m])`.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..engine.stats import EngineStats, HostTierSnapshot
from ..engine.vllm_metrics import vllm_families


class EngineMetrics:
    def __init__(self, stats: Callable[[], EngineStats], model_name: str):
        self.stats, self.model_name = stats, model_name  # the engine's latest published EngineStats
        self.internal_errors = 0  # requests answered 500 by the server (errors.py), each a bug to look up in the log
        self.client_hangups = 0  # clients that closed the connection before their body arrived (errors.py)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def collect(self):
        """Called by prometheus_client on each scrape, on the server's thread: it reads one published record."""
        stats, labels = self.stats(), {"model_name": self.model_name}

        def gauge(name, doc, value):
            g = GaugeMetricFamily(f"nano_infer_{name}", doc, labels=list(labels))
            g.add_metric(list(labels.values()), value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(f"nano_infer_{name}", doc, labels=list(labels))
            c.add_metric(list(labels.values()), value)
            return c

        yield gauge("num_requests_running", "Sequences in the running batch.", stats.num_running)
        yield gauge("num_requests_waiting", "Sequences waiting to be admitted.", stats.num_waiting)
        if stats.num_kv_blocks:
            total, free = stats.num_kv_blocks, stats.num_free_kv_blocks
            yield gauge("kv_blocks_total", "KV cache blocks in the pool.", total)
            yield gauge("kv_blocks_free", "KV cache blocks on the free list.", free)
            yield gauge("kv_blocks_used", "KV cache blocks held by sequences or the prefix cache.", total - free)
            yield gauge("kv_cache_usage_perc", "Fraction of the KV cache blocks in use.", stats.kv_usage)
        prefix = stats.prefix_cache
        if prefix is not None:
            yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", prefix.query_tokens)
            yield counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.", prefix.hit_tokens)
            yield gauge("prefix_cache_hit_rate", "Hits / queries since the start.", prefix.hit_rate)
        if stats.host_tier is not None:
            hits = prefix.hit_tokens if prefix is not None else 0
            yield counter("kv_device_hits", "Prompt tokens served from the device tier (of prefix_cache_hits).",
                          hits - stats.host_tier.stats.hit_tokens)
            yield from self._tier(stats.host_tier, gauge, counter)
        yield counter("forward_tokens", "Tokens computed by the model (prompt chunks and decode inputs).",
                      stats.num_forward_tokens)
        yield counter("generation_tokens", "Tokens generated.", stats.num_generated_tokens)
        yield counter("num_steps", "Engine steps run.", stats.num_steps)
        yield counter("server_internal_errors", "Requests answered 500 (internal error, in the server log).",
                      self.internal_errors)
        yield counter("client_hangups", "Clients that closed the connection before their request body arrived.",
                      self.client_hangups)
        yield from vllm_families(stats, self.model_name)

    @staticmethod
    def _tier(tier: HostTierSnapshot, gauge, counter):
        """The host tier (chapter 12): its blocks, hits, and what moved each way."""
        stats = tier.stats
        yield gauge("kv_host_blocks_total", "Blocks of the host KV tier.", tier.num_blocks)
        yield gauge("kv_host_blocks_free", "Host tier blocks on its free list.", tier.num_free_blocks)
        yield gauge("kv_host_blocks_cached", "Host tier blocks holding an offloaded prefix block.", tier.num_cached_blocks)
        yield counter("kv_host_hits", "Prompt tokens served from the host tier (of prefix_cache_hits).", stats.hit_tokens)
        yield counter("kv_offload_blocks", "Evicted prefix blocks copied device -> host.", stats.offloaded_blocks)
        yield counter("kv_load_blocks", "Prefix blocks copied host -> device for a match.", stats.loaded_blocks)
        yield counter("kv_swap_out_blocks", "Blocks of preempted sequences copied device -> host.", stats.swapped_out_blocks)
        yield counter("kv_swap_in_blocks", "Blocks of preempted sequences copied host -> device.", stats.swapped_in_blocks)
        yield counter("kv_host_dropped_blocks", "Evicted blocks the host tier could not keep.", stats.dropped_blocks)
        yield counter("kv_bytes_to_host", "Bytes copied device -> host.", tier.bytes_to_host)
        yield counter("kv_bytes_to_device", "Bytes copied host -> device.", tier.bytes_to_device)
        yield counter("num_preemptions_swap", "Preemptions that swapped the sequence out.", stats.swap_preemptions)
        yield counter("num_preemptions_recompute", "Preemptions that dropped the K/V to recompute it (host tier on).",
                      stats.recompute_preemptions)
