"""Per-request latencies in vLLM's histograms, and `get_metrics(engine)` (vLLM's `LLM.get_metrics()` records)."""
import pytest

from nano_infer import LLMEngine, SamplingParams
from nano_infer.engine.request_stats import TTFT_BUCKETS, Histogram
from nano_infer.engine.vllm_metrics import Counter, Gauge, Histogram as HistogramRecord, get_metrics
from nano_infer.models.loader import TINY_MODEL_DIR


def run(engine, lengths: dict[str, int]) -> dict:
    """Queue one request per (id, max_tokens), all at once, and step until they finish; their outputs by id."""
    for i, (rid, n) in enumerate(lengths.items()):
        engine.add_request(rid, prompt_token_ids=list(range(1, 6 + i)), params=SamplingParams(max_tokens=n, ignore_eos=True))
    done = {}
    while engine.has_unfinished_requests():
        done |= {out.request_id: out for out in engine.step() if out.finished}
    return done


def by_name(engine) -> dict:
    return {(m.name, m.labels.get("finished_reason")): m for m in get_metrics(engine)}


def test_a_value_on_a_bound_counts_in_that_bound_s_bucket_and_counts_are_cumulative():
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 7.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap.cumulative == (2, 3, 4) and snap.count == 4 and snap.sum == pytest.approx(10.0)
    h.observe(0.1)
    assert snap.cumulative == (2, 3, 4)  # a snapshot is a copy


def test_each_request_s_moments_are_counted_once_in_vllm_s_series():
    engine = LLMEngine(str(TINY_MODEL_DIR), dtype="float32", block_size=4)
    before = engine.stats
    done = run(engine, {"a": 5, "b": 3, "c": 4})
    m = by_name(engine)
    ttft, itl = m["vllm:time_to_first_token_seconds", None], m["vllm:inter_token_latency_seconds", None]
    e2e, queue = m["vllm:e2e_request_latency_seconds", None], m["vllm:request_queue_time_seconds", None]
    assert isinstance(ttft, HistogramRecord) and ttft.labels == {"model_name": "tiny", "engine": "0"}
    assert ttft.count == e2e.count == queue.count == 3 and itl.count == 4 + 2 + 3  # a gap per later token
    assert list(ttft.buckets) == [str(b) for b in TTFT_BUCKETS] + ["+Inf"] and ttft.buckets["+Inf"] == 3
    metrics = [out.metrics for out in done.values()]
    assert ttft.sum == pytest.approx(sum(x.ttft for x in metrics)) and ttft.sum > 0
    assert itl.sum == pytest.approx(sum(x.token_times[-1] - x.token_times[0] for x in metrics))
    assert e2e.sum == pytest.approx(sum(x.finished_time - x.arrival_time for x in metrics))
    assert queue.sum == pytest.approx(sum(x.first_scheduled_time - x.arrival_time for x in metrics))
    assert m["vllm:prompt_tokens", None] == Counter("vllm:prompt_tokens", ttft.labels, 5 + 6 + 7)
    assert m["vllm:generation_tokens", None].value == 12 and m["vllm:request_success", "length"].value == 3
    assert m["vllm:prefix_cache_queries", None].value == 18
    assert isinstance(m["vllm:num_requests_running", None], Gauge) and m["vllm:num_requests_running", None].value == 0
    assert before.requests.time_to_first_token.count == 0  # what was published before stays as it was


def test_an_aborted_request_counts_its_end_and_reason_and_no_first_token():
    engine = LLMEngine(str(TINY_MODEL_DIR), dtype="float32", block_size=4)
    engine.add_request("gone", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=4))
    engine.abort_request("gone")
    engine.step()
    m = by_name(engine)
    assert m["vllm:request_success", "abort"].value == 1 and m["vllm:request_success", "length"].value == 0
    assert m["vllm:e2e_request_latency_seconds", None].count == m["vllm:request_queue_time_seconds", None].count == 1
    assert m["vllm:time_to_first_token_seconds", None].count == 0 and m["vllm:prompt_tokens", None].value == 0
