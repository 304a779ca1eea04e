"""Chapter 12's measurements (nano_infer.bench.offload): the counts they report, never their timings."""
import pytest

from nano_infer import LLM, default_model
from nano_infer.bench import offload as ob
from nano_infer.kv.host_tier import HostTierStats

BS = 16
BLOCK_BYTES = 2560 * BS  # the shipped model in float32: 2,560 bytes of K/V per token


def make_llm(num_kv_blocks, host_blocks=0, **options):
    size = host_blocks * BLOCK_BYTES / 2**30
    return LLM(default_model(), dtype="float32", block_size=BS, num_kv_blocks=num_kv_blocks,
               kv_offloading_size=size, **options)


@pytest.fixture(scope="module")
def chat_runs():
    llms = {"no tier": make_llm(20), "host tier": make_llm(20, host_blocks=128)}
    assert llms["host tier"].engine.kv.tier.num_blocks == 128
    chats = ob.multi_turn_chats(llms["no tier"].tokenizer, num_chats=4, num_turns=3, system_tokens=32)
    return llms, chats, ob.run_chats(llms, chats, max_tokens=8)


def test_the_chats_take_turns_so_each_history_waits_behind_the_others():
    chats = ob.Chats("system", [["a1", "a2"], ["b1", "b2", "b3"], ["c1"]])
    assert ob.turn_order(chats) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (1, 2)]
    assert chats.num_requests == 6


def test_the_workload_builds_distinct_user_turns_after_one_system_prompt():
    tokenizer = make_llm(8).tokenizer
    chats = ob.multi_turn_chats(tokenizer, num_chats=5, num_turns=3, system_tokens=40)
    lines = [line for turns in chats.turns for line in turns]
    assert len(chats.turns) == 5 and all(len(t) == 3 for t in chats.turns) and len(set(lines)) == 15
    assert len(tokenizer.encode(chats.system, add_special_tokens=False)) >= 40


def test_both_engines_see_the_same_prompts_and_reply_the_same_tokens(chat_runs):
    _, chats, runs = chat_runs
    plain, tiered = runs["no tier"], runs["host tier"]
    assert len(plain.records) == len(tiered.records) == chats.num_requests
    for a, b in zip(plain.records, tiered.records):
        assert (a.chat, a.turn, a.prompt_tokens) == (b.chat, b.turn, b.prompt_tokens)
        assert a.output_token_ids == b.output_token_ids


def test_every_prompt_token_is_either_served_by_a_cache_or_prefilled(chat_runs):
    _, _, runs = chat_runs
    for run in runs.values():
        for r in run.records:
            assert r.cached_tokens + r.prefill_tokens == r.prompt_tokens
            assert 0 <= r.host_cached_tokens <= r.cached_tokens and r.cached_tokens % BS == 0
        assert run.prompt_tokens == run.cached_tokens + run.prefill_tokens


def test_the_tier_serves_history_the_small_device_pool_evicted(chat_runs):
    _, _, runs = chat_runs
    plain, tiered = runs["no tier"], runs["host tier"]
    assert plain.host_cached_tokens == 0 and plain.tier is None
    assert tiered.host_cached_tokens > 0 and tiered.cached_tokens > plain.cached_tokens
    assert tiered.tier.offloaded_blocks > 0 and tiered.tier.loaded_blocks > 0
    assert tiered.tier.hit_tokens == tiered.host_cached_tokens
    assert sum(r.blocks_in for r in tiered.records) == tiered.tier.loaded_blocks == tiered.host_cached_tokens // BS
    assert sum(r.blocks_out for r in tiered.records) == tiered.tier.offloaded_blocks
    assert all(r.host_cached_tokens == 0 for r in tiered.records if r.turn == 0)  # nothing to find before turn 1
    row = tiered.summary()
    assert row["cached"] == row["cached (device)"] + row["cached (host tier)"]
    assert row["blocks in"] == tiered.tier.loaded_blocks and row["median TTFT ms"] > 0


def test_prefix_cost_puts_the_prefix_where_each_variant_says():
    llm = make_llm(64, host_blocks=64)
    cost = ob.prefix_cost(llm, 48, rounds=1, warmup=0)
    assert cost.prompt_tokens == 48 + 8
    assert cost.cached == {"host tier": 48, "device cache": 48, "no cache": 0}
    assert cost.host_cached == {"host tier": 48, "device cache": 0, "no cache": 0}
    assert cost.blocks_loaded == 3
    assert set(cost.timings.samples) == set(ob.VARIANTS) and all(len(s) == 1 for s in cost.timings.samples.values())
    row = cost.row()
    assert row["prefix tokens"] == 48 and row["recompute / load"] > 0
    estimate = ob.cost_model_estimate(llm, 48)  # the rates were measured by the runs above
    assert estimate["model: load ms"] > 0 and estimate["model: recompute ms"] > 0
    assert llm.engine.kv.num_available_blocks == 64  # prefix_cost leaves both tiers empty
    assert llm.engine.kv.tier.num_cached_blocks() == 0


def test_offload_cached_moves_every_idle_block_to_the_host():
    llm = make_llm(32, host_blocks=32)
    prompt = ob.prefixed_prompt(llm.tokenizer, 64, 8)
    ob.run_turn(llm, prompt, 1)
    assert ob.offload_cached(llm) == 4
    assert llm.engine.prefix_cache.num_cached_blocks() == 0 and llm.engine.kv.tier.num_cached_blocks() == 4
    assert not llm.engine.kv.tier.pending_out  # copied already, not left for the next step
    record, _ = ob.run_turn(llm, prompt, 1)
    assert (record.cached_tokens, record.host_cached_tokens, record.blocks_in) == (64, 64, 4)


def test_swap_and_recompute_preemption_give_the_same_tokens():
    prompts = [ob.prefixed_prompt(make_llm(8).tokenizer, 40, 0, seed=s) for s in range(3)]
    runs = {"no tier": ob.run_preempting(make_llm(10), prompts, 40)}
    for mode in ("recompute", "swap", "auto"):
        runs[mode] = ob.run_preempting(make_llm(10, host_blocks=64, preemption_mode=mode), prompts, 40)
    swap, recompute, plain = runs["swap"], runs["recompute"], runs["no tier"]
    assert all(r.outputs == plain.outputs for r in runs.values()) and all(len(o) == 40 for o in plain.outputs)
    assert all(r.preemptions > 0 for r in runs.values())
    assert swap.tier.swap_preemptions == swap.preemptions and swap.tier.recompute_preemptions == 0
    assert swap.tier.swapped_out_blocks == swap.tier.swapped_in_blocks > 0
    assert recompute.tier.swap_preemptions == 0 and recompute.tier.recompute_preemptions == recompute.preemptions
    assert recompute.tier.swapped_out_blocks == 0
    auto = runs["auto"].tier
    assert auto.swap_preemptions + auto.recompute_preemptions == runs["auto"].preemptions
    assert plain.tier == ob.HostTierStats()  # no tier: nothing counted there
    assert plain.forward_tokens > swap.forward_tokens  # what the swap saved: tokens computed again
    assert swap.row()["swap preemptions"] == swap.tier.swap_preemptions


def test_stats_delta_subtracts_every_counter():
    before = HostTierStats(hit_tokens=3, offloaded_blocks=2, loaded_blocks=1)
    after = HostTierStats(hit_tokens=10, offloaded_blocks=5, loaded_blocks=1, swap_preemptions=2)
    delta = ob.stats_delta(after, before)
    assert (delta.hit_tokens, delta.offloaded_blocks, delta.loaded_blocks, delta.swap_preemptions) == (7, 3, 0, 2)
