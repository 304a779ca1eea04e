"""/metrics serves vLLM's `vllm:*` series beside the `nano_infer_` ones: a Prometheus scrape parses and moves."""
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nano_infer.engine.vllm_metrics import get_metrics
from tests.helpers.engine_checks import metrics_text, serving

CHAT = [{"role": "user", "content": "To be, or not to be?"}]
SERIES = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
          "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:prefix_cache_queries": "counter",
          "vllm:prefix_cache_hits": "counter", "vllm:time_to_first_token_seconds": "histogram",
          "vllm:inter_token_latency_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
          "vllm:request_queue_time_seconds": "histogram"}
HISTOGRAMS = [name for name, kind in SERIES.items() if kind == "histogram"]


@pytest.fixture(scope="module")
def served(qwen2_dir):
    with serving(qwen2_dir) as both:  # a server of its own: its counts are this module's requests only
        yield both


def scrape(url) -> dict:
    """{(sample name, labels without model_name/engine): value} of the vllm series, and the families' types."""
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(url)) if f.name.startswith("vllm:")}
    return families, {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))):
                      s.value for f in families.values() for s in f.samples}


def test_the_vllm_series_parse_with_vllm_s_labels_and_move_under_load(server, client, model):
    families, before = scrape(server.url)
    assert {name: families[name].type for name in SERIES} == SERIES
    assert all(s.labels["model_name"] == model and s.labels["engine"] == "0" for f in families.values() for s in f.samples)
    assert "nano_infer_generation_tokens_total" in metrics_text(server.url)  # beside today's names
    for _ in range(2):
        client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, stream=True,
                                                 extra_body={"ignore_eos": True}))
    assert chunks
    families, after = scrape(server.url)
    moved = {name: after[name, ()] - before[name, ()] for name in
             ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total")}
    assert moved["vllm:generation_tokens_total"] == 12 and moved["vllm:prompt_tokens_total"] > 0, moved
    assert moved["vllm:prefix_cache_queries_total"] == moved["vllm:prompt_tokens_total"]
    assert after["vllm:request_success_total", (("finished_reason", "length"),)] == 3
    for name in HISTOGRAMS:
        assert after[f"{name}_count", ()] == after[f"{name}_bucket", (("le", "+Inf"),)]
        buckets = [s.value for s in families[name].samples if s.name.endswith("_bucket")]
        assert buckets == sorted(buckets)  # cumulative
    assert {name: after[f"{name}_count", ()] for name in HISTOGRAMS} == {
        "vllm:time_to_first_token_seconds": 3, "vllm:inter_token_latency_seconds": 3 * 3,
        "vllm:e2e_request_latency_seconds": 3, "vllm:request_queue_time_seconds": 3}
    assert after["vllm:time_to_first_token_seconds_sum", ()] > 0
    assert after["vllm:num_requests_running", ()] == after["vllm:num_requests_waiting", ()] == 0


def test_get_metrics_returns_what_the_scrape_shows(server, allm, client, model):
    client.completions.create(model=model, prompt="Hello", max_tokens=3, extra_body={"ignore_eos": True})
    families, scraped = scrape(server.url)
    records = get_metrics(allm.engine)
    assert {r.name for r in records} == set(families)
    for r in records:
        labels = tuple(sorted((k, v) for k, v in r.labels.items() if k not in ("model_name", "engine")))
        if hasattr(r, "buckets"):
            assert (r.count, r.sum) == (scraped[f"{r.name}_count", labels], pytest.approx(scraped[f"{r.name}_sum", labels]))
            assert r.buckets == {le: scraped[f"{r.name}_bucket", labels + (("le", le),)] for le in r.buckets}
            assert math.isclose(r.buckets["+Inf"], r.count)
        else:
            suffix = "_total" if families[r.name].type == "counter" else ""
            assert r.value == pytest.approx(scraped[r.name + suffix, labels]), r
