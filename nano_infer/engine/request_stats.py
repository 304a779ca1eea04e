"""Per-request latencies as Prometheus histograms, counted on the engine's thread (vLLM's request stats).

A gauge or a counter can be read off the engine when Prometheus scrapes; a latency histogram cannot:
each request's time to first token, its gaps between tokens, its time in the queue and its whole
time must each be counted once, when it happens, and the requests are gone from the engine by the
time a scrape comes. So the engine feeds every step's requests to `RequestStats`, which keeps
bucket counts (not the observations: memory stays flat however many requests pass), and publishes
an immutable `RequestStatsSnapshot` with its `EngineStats` after each step (stats.py): the scrape
thread reads that record, never the counts the engine thread is adding to.

The moments come from each request's `RequestMetrics` (outputs.py), vLLM's definitions:
time to first token when the first token is sampled, one inter-token gap per later step that gave
the request tokens (a speculative step that accepts several is one gap, as in vLLM), and at the
end the time in the engine's waiting queue (arrival -> first scheduled) and end to end
(arrival -> finished). The bucket boundaries are vLLM's, so its dashboards' quantiles read the same.
"""
from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.request import Request

# vLLM's boundaries (vllm/v1/metrics/loggers.py), seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class HistogramSnapshot:
    """A histogram as Prometheus exposes it: cumulative counts per upper bound (`le`), then +Inf."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]  # len(bounds) + 1: observations <= each bound, the last one all of them
    sum: float = 0.0

    @property
    def count(self) -> int:
        return self.cumulative[-1]


@dataclass
class Histogram:
    """Bucket counts the engine thread adds to; `snapshot()` is what other threads read."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last one is +Inf
    sum: float = 0.0

    def __post_init__(self):
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # the first bound >= value: Prometheus' `le`
        self.sum += value

    def snapshot(self) -> HistogramSnapshot:
        running, cumulative = 0, []
        for n in self.counts:
            running += n
            cumulative.append(running)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self.sum)


def empty(bounds: tuple[float, ...]) -> HistogramSnapshot:
    return HistogramSnapshot(bounds, (0,) * (len(bounds) + 1))


@dataclass(frozen=True)
class RequestStatsSnapshot:
    """What the engine's requests added up to since the start, as of its last step."""

    prompt_tokens: int = 0  # each request's whole prompt, counted at its first token (vLLM's prompt_tokens)
    num_preemptions: int = 0  # of finished requests, counted when they finish
    finished: tuple[tuple[str, int], ...] = ()  # (finish reason, requests)
    time_to_first_token: HistogramSnapshot = empty(TTFT_BUCKETS)
    inter_token_latency: HistogramSnapshot = empty(INTER_TOKEN_BUCKETS)
    e2e_request_latency: HistogramSnapshot = empty(REQUEST_LATENCY_BUCKETS)
    request_queue_time: HistogramSnapshot = empty(REQUEST_LATENCY_BUCKETS)


class RequestStats:
    """Counts each request's moments once, as the engine's steps reach them (engine thread only)."""

    def __init__(self):
        self.ttft, self.itl = Histogram(TTFT_BUCKETS), Histogram(INTER_TOKEN_BUCKETS)
        self.e2e, self.queue = Histogram(REQUEST_LATENCY_BUCKETS), Histogram(REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = self.num_preemptions = 0
        self.finished: dict[str, int] = {}
        self._times_seen: dict[str, int] = {}  # live requests: how many of their token_times are counted
        self._snapshot = RequestStatsSnapshot()  # rebuilt only after a step that changed something
        self._changed = False

    def observe(self, requests: Iterable[Request]) -> None:
        """The requests a step touched: their new tokens' moments, and the end of those that finished."""
        for req in requests:
            times, seen = req.metrics.token_times, self._times_seen.get(req.request_id, 0)
            if len(times) > seen:
                if seen == 0:
                    self.ttft.observe(times[0] - req.metrics.arrival_time)
                    self.prompt_tokens += len(req.prompt_token_ids)
                for before, after in zip(times[max(seen, 1) - 1:], times[max(seen, 1):]):
                    self.itl.observe(after - before)
                self._times_seen[req.request_id] = len(times)
                self._changed = True
            if req.finished:
                self.finish(req)

    def finish(self, req: Request) -> None:
        """A request that finished (or was aborted): its time queued and end to end, and why it ended."""
        m = req.metrics
        end = m.finished_time if m.finished_time is not None else time.perf_counter()
        self.e2e.observe(end - m.arrival_time)
        self.queue.observe((m.first_scheduled_time if m.first_scheduled_time is not None else end) - m.arrival_time)
        reason = req.seqs[0].finish_reason if req.seqs and req.seqs[0].finish_reason else "abort"
        self.finished[reason] = self.finished.get(reason, 0) + 1
        self.num_preemptions += sum(s.num_preemptions for s in req.seqs)
        self._times_seen.pop(req.request_id, None)
        self._changed = True

    def snapshot(self) -> RequestStatsSnapshot:
        """An immutable record for readers on other threads (the same object while nothing changed)."""
        if self._changed:
            self._snapshot = RequestStatsSnapshot(
                self.prompt_tokens, self.num_preemptions, tuple(sorted(self.finished.items())), self.ttft.snapshot(),
                self.itl.snapshot(), self.e2e.snapshot(), self.queue.snapshot())
            self._changed = False
        return self._snapshot
