"""The host tier's figures: per request (RequestOutput.metrics), on /metrics, and its options on the command line."""
import argparse
import re

import httpx

from nano_infer import LLM, SamplingParams
from nano_infer.cli.engine_args import add_engine_args, engine_kwargs
from nano_infer.async_engine.metrics import EngineMetrics
from tests.helpers.engine_checks import metrics_text, serving

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
BS = 4


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    return [[(seed * 131 + i * 17 + j * 7) % 250 + 3 for j in range(length)] for i in range(n)]


def metric_values(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(nano_infer_\w+)\{[^}]*\} (\S+)$", text, re.M)}


def test_a_request_served_from_the_host_tier_says_so(qwen2_dir):
    """Six 32-token prompts fill a 24-block pool three times over: their second run finds most blocks
    on the host only, and each request's metrics count them, as tokens, blocks and bytes."""
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=BS, num_kv_blocks=24, kv_offloading_size=0.01)
    ps = prompts(6, 32, seed=1)
    llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    stats = llm.engine.kv.tier.stats
    hits_before, blocks_in_before = stats.hit_tokens, stats.blocks_in
    second = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    block_bytes = llm.engine.kv_bytes_per_token * BS
    assert stats.loaded_blocks > 0
    host_tokens = [o.metrics.num_host_cached_tokens for o in second]
    assert sum(host_tokens) == stats.hit_tokens - hits_before > 0
    for out in second:
        m = out.metrics
        assert m.num_host_cached_tokens <= m.num_cached_tokens <= len(out.prompt_token_ids)
        assert m.kv_blocks_in * BS >= m.num_host_cached_tokens  # a loaded block per BS tokens served from the host
        assert m.kv_bytes_in == m.kv_blocks_in * block_bytes and m.kv_blocks_out == m.kv_bytes_out == 0
    assert sum(o.metrics.kv_blocks_in for o in second) == stats.blocks_in - blocks_in_before


def test_a_swapped_request_counts_its_blocks_out_and_back(qwen2_dir):
    """Eight requests growing to 40 tokens (10 blocks of 4) on 18 blocks: two run, then one must give way; it
    swaps (prefix cache off, so nothing else moves)."""
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=BS, num_kv_blocks=18, prefix_cache=None,
              kv_offloading_size=0.01, preemption_mode="swap")
    outs = llm.generate(prompt_token_ids=prompts(8, 28, seed=2),
                        sampling_params=SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    stats = llm.engine.kv.tier.stats
    assert stats.swap_preemptions > 0 and stats.recompute_preemptions == 0
    assert sum(o.metrics.kv_blocks_out for o in outs) == stats.swapped_out_blocks > 0
    assert sum(o.metrics.kv_blocks_in for o in outs) == stats.swapped_in_blocks == stats.swapped_out_blocks
    swapped = [o for o in outs if o.metrics.kv_blocks_out]
    assert all(o.metrics.num_preemptions > 0 for o in swapped)


def test_engine_metrics_report_the_tier(qwen2_dir):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=BS, num_kv_blocks=24, kv_offloading_size=0.01)
    ps = prompts(6, 32, seed=3)
    for _ in range(2):
        llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    engine, stats = llm.engine, llm.engine.kv.tier.stats
    values = metric_values(EngineMetrics(lambda: engine.stats, "m").render()[0].decode())
    block_bytes = engine.kv_bytes_per_token * BS
    assert values["nano_infer_kv_host_blocks_total"] == engine.kv.tier.num_blocks
    assert values["nano_infer_kv_host_hits_total"] == stats.hit_tokens > 0
    assert values["nano_infer_kv_offload_blocks_total"] == stats.offloaded_blocks > 0
    assert values["nano_infer_kv_load_blocks_total"] == stats.loaded_blocks > 0
    assert values["nano_infer_kv_bytes_to_host_total"] == stats.blocks_out * block_bytes
    assert values["nano_infer_kv_bytes_to_device_total"] == stats.blocks_in * block_bytes
    assert values["nano_infer_kv_host_blocks_cached"] == engine.kv.tier.num_cached_blocks()
    assert (values["nano_infer_kv_device_hits_total"] + values["nano_infer_kv_host_hits_total"]
            == values["nano_infer_prefix_cache_hits_total"] == engine.prefix_cache.stats.hit_tokens)


def test_engine_metrics_without_a_tier_have_no_tier_lines(qwen2_dir):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=BS, num_kv_blocks=24)
    llm.generate(prompt_token_ids=prompts(2, 8, seed=4), sampling_params=GREEDY)
    text = EngineMetrics(lambda: llm.engine.stats, "m").render()[0].decode()
    assert "nano_infer_kv_blocks_total" in text and "kv_host" not in text and "kv_offload" not in text


def test_command_line_options_reach_the_engine():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    kwargs = engine_kwargs(p.parse_args(["--kv-offloading-size", "0.5", "--preemption-mode", "swap"]))
    assert kwargs["kv_offloading_size"] == 0.5 and kwargs["preemption_mode"] == "swap"
    defaults = engine_kwargs(p.parse_args([]))
    assert defaults["kv_offloading_size"] == 0 and defaults["preemption_mode"] is None


def test_server_with_a_host_tier_serves_and_reports_it(qwen2_dir):
    """`nano-infer serve --kv-offloading-size`: the same engine behind the API; /metrics shows the tier."""
    with serving(qwen2_dir, num_kv_blocks=24, kv_offloading_size=0.01) as (llm, server):
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 3, "temperature": 0}
        replies = [httpx.post(server.url + "/v1/completions", json=dict(body, prompt=p), timeout=60)
                   for p in prompts(6, 32, seed=5) * 2]
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
        cached = [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies[6:]]
        values = metric_values(metrics_text(server.url))
    assert values["nano_infer_kv_load_blocks_total"] > 0 and values["nano_infer_kv_host_hits_total"] > 0
    assert sum(cached) >= values["nano_infer_kv_host_hits_total"]
