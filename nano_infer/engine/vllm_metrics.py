"""vLLM's metric names over the engine's published stats: the `vllm:*` series of `/metrics`, and `LLM.get_metrics()`.

vLLM's dashboards and alert rules query `vllm:num_requests_running`, `vllm:time_to_first_token_seconds`
and the rest by name, with the labels `model_name` and `engine`; serving the same names, labels and
bucket boundaries lets them point at this server unchanged. Both readers here take one published
`EngineStats` (stats.py) and nothing else, so the HTTP server's scrape thread never reads what the
engine thread is changing, and a scrape and `get_metrics()` taken between the same two steps agree.

`get_metrics` returns vLLM's reader records (vllm.v1.metrics.reader): a `Counter`, `Gauge` or
`Histogram` per series, named as Prometheus names the family (a counter without `_total`), with
the histogram's cumulative bucket counts keyed by their `le` text, "+Inf" last. The records import from
`nano_infer.v1.metrics.reader` too, vLLM's path with `vllm` swapped, so its metrics example runs unchanged.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric as MetricFamily
from prometheus_client.utils import floatToGoString

from .request_stats import HistogramSnapshot
from .stats import EngineStats

if TYPE_CHECKING:
    from .llm_engine import LLMEngine

LABELS = ("model_name", "engine")  # vLLM's; `engine` is the engine core's index, always "0" here
FINISH_REASONS = ("stop", "length", "abort")  # vLLM shows each from the start, at 0 until one happens


@dataclass
class Metric:
    """One series: its family's name and its labels."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    """vLLM's counters per position (speculative decoding's accepted tokens); none are served here yet."""

    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    """Cumulative counts per upper bound (`le` as Prometheus writes it, "+Inf" for all), their count and sum."""

    count: int
    sum: float
    buckets: dict[str, int]


def vllm_families(stats: EngineStats, model_name: str) -> Iterator[MetricFamily]:
    """The `vllm:*` metric families of one published EngineStats, as prometheus_client's collectors yield them."""
    values = [model_name, "0"]

    def gauge(name, doc, value):
        family = GaugeMetricFamily(f"vllm:{name}", doc, labels=LABELS)
        family.add_metric(values, value)
        return family

    def counter(name, doc, value):
        family = CounterMetricFamily(f"vllm:{name}", doc, labels=LABELS)
        family.add_metric(values, value)
        return family

    def histogram(name, doc, h: HistogramSnapshot):
        family = HistogramMetricFamily(f"vllm:{name}", doc, labels=LABELS)
        les = [floatToGoString(b) for b in h.bounds] + ["+Inf"]
        family.add_metric(values, list(zip(les, h.cumulative)), h.sum)
        return family

    requests, prefix = stats.requests, stats.prefix_cache
    yield gauge("num_requests_running", "Number of requests in model execution batches (each sample of n > 1 "
                "and each beam is one, as vLLM runs them).", stats.num_running)
    yield gauge("num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting)
    yield gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_usage)
    yield counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                  prefix.query_tokens if prefix else 0)
    yield counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                  prefix.hit_tokens if prefix else 0)
    yield counter("num_preemptions", "Cumulative number of preemptions of finished requests.", requests.num_preemptions)
    yield counter("prompt_tokens", "Number of prefill tokens processed.", requests.prompt_tokens)
    yield counter("generation_tokens", "Number of generation tokens processed.", stats.num_generated_tokens)
    success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=(*LABELS, "finished_reason"))
    finished = dict(requests.finished)
    for reason in sorted(set(FINISH_REASONS) | set(finished), key=lambda r: (r not in FINISH_REASONS, r)):
        success.add_metric([*values, reason], finished.get(reason, 0))
    yield success
    yield histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                    requests.time_to_first_token)
    yield histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                    requests.inter_token_latency)
    yield histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                    requests.e2e_request_latency)
    yield histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                    requests.request_queue_time)


def get_metrics(engine: LLMEngine) -> list[Metric]:
    """vLLM's `LLM.get_metrics()`: the engine's `vllm:*` series now, as reader records."""
    stats = engine.stats  # one published record: every series below is read from the same step
    return [m for family in vllm_families(stats, stats.model_name) for m in records(family)]


def records(family: MetricFamily) -> list[Metric]:
    """A family's samples as vLLM's reader gives them: one record per label set."""
    if family.type == "gauge":
        return [Gauge(family.name, dict(s.labels), float(s.value)) for s in family.samples]
    if family.type == "counter":
        return [Counter(family.name, dict(s.labels), int(s.value)) for s in family.samples
                if s.name == family.name + "_total"]
    by_labels: dict[tuple, Histogram] = {}
    for s in family.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        h = by_labels.setdefault(tuple(sorted(labels.items())), Histogram(family.name, labels, 0, 0.0, {}))
        if s.name.endswith("_bucket"):
            h.buckets[s.labels["le"]] = int(s.value)
        elif s.name.endswith("_count"):
            h.count = int(s.value)
        elif s.name.endswith("_sum"):
            h.sum = s.value
    return list(by_labels.values())


def _register_vllm_paths() -> None:
    for path in ("nano_infer.v1.metrics", "nano_infer.v1.metrics.reader"):
        sys.modules.setdefault(path, sys.modules[__name__])


_register_vllm_paths()
