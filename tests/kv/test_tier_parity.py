"""Stage 12, the host tier: the same tokens with it as without it (and as transformers), in every
engine configuration, with the tier actually doing its work; its settings checked.

The workload overflows a small device pool on purpose: four chats, each on its own long opening,
run turn 1, then turn 2 (turn 1's prompt + its answer + a new question), then turn 1 again. The
pool (16 blocks of 4 tokens) holds about two chats, so the prefixes of the others are evicted to
the host tier and loaded back for their next turn, and the four running together preempt each
other. Every test asserts the tier counters that prove the path under test ran (a test that
passes while the tier is never touched proves nothing), checks after every engine step that
each block of both tiers is held exactly by what references it, and ends with no block of
either tier left in use.
"""
import itertools
import json
from collections import Counter

import pytest
import torch

from nano_infer import LLM, BeamSearchParams, SamplingParams
from tests.helpers.beam_reference import hf_beams
from tests.helpers.model_factory import hf_model
from tests.helpers.prompt_scores import hf_scores, score_error

MAX_NEW = 6
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
TIER = dict(block_size=4, num_kv_blocks=16, kv_offloading_size=0.01)  # a small pool over a 10 MiB host tier
CHATS = [  # (opening, turn-1 question, turn-2 question): a long opening of its own each, so each chat's
    # prefix fills blocks no other chat shares; chosen so transformers' answers vary (4+ distinct tokens
    # of 6), which makes wrong K/V show
    ("To be, or not to be, that is the question: whether 'tis nobler", " score", " 🙂🚀"),
    ("The quick brown fox jumps over the lazy dog 0123456789.", " 你好，世界！", " or not"),
    ('{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true}', " in the mind", " or not"),
    ("def f(x): return x * 2  # code and more code", " café naïve", " or not"),
]
_ids = itertools.count()


def reference(hf, prompts):
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() for p in prompts]


@pytest.fixture(scope="module")
def hf(qwen2_dir):
    return hf_model(qwen2_dir)


@pytest.fixture(scope="module")
def chats(hf, tokenizer):
    """Turn-1 prompts and transformers' answers, then turn-2 prompts (the chat so far + a new question) and answers."""
    turn1 = [tokenizer.encode(opening + q1) for opening, q1, _ in CHATS]
    ref1 = reference(hf, turn1)
    turn2 = [p + a + tokenizer.encode(q2) for p, a, (*_, q2) in zip(turn1, ref1, CHATS)]
    ref2 = reference(hf, turn2)
    assert all(len(set(r)) >= 4 for r in ref1 + ref2), f"random model too repetitive for a meaningful check: {ref1 + ref2}"
    return turn1, ref1, turn2, ref2


# -- checks ----------------------------------------------------------------------------------------------
def check_tiers(engine) -> None:
    """After a step: every block of both tiers is held by exactly what references it.

    Device: the block tables of unfinished sequences, plus the prefix cache's one reference on each
    block it keeps. Host: the tier's index (one on each cached block), each swapped-out sequence that
    lists a block, and each load whose copy is still to be taken. Free lists hold exactly the rest."""
    kv, tier = engine.kv, engine.offloader and engine.offloader.tier  # the host tier, if there is one
    seqs = [s for req in engine.requests.values() for s in req.seqs if not s.is_finished]
    device = Counter(b for s in seqs for b in s.block_table)
    assert [device[b] + kv.holds(b) for b in range(kv.num_blocks)] == kv.ref_count, "device ref counts vs holders"
    assert sorted(kv.blocks.pool.free_blocks) == [b for b, r in enumerate(kv.ref_count) if r == 0], "device free list"
    if tier is None:
        return
    host = Counter(h for s in seqs if s.seq_id in tier.swapped for h in tier.swapped[s.seq_id].blocks)
    host.update(tier.index.values())
    host.update(tier.releases)
    assert [host[h] for h in range(tier.num_blocks)] == tier.ref_count, "host ref counts vs holders"
    assert sorted(tier.pool.free_blocks) == [h for h, r in enumerate(tier.ref_count) if r == 0], "host free list"
    for s in seqs:
        assert not (s.seq_id in tier.swapped and s.block_table), "a sequence both swapped out and on the device"


def assert_all_free(engine) -> None:
    """Nothing left running, and once both caches are cleared every block of both tiers is free."""
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting
    kv, tier = engine.kv, engine.offloader and engine.offloader.tier
    kv.clear()
    assert kv.num_free_blocks == kv.num_blocks and not any(kv.ref_count), "device blocks leaked"
    if tier is None:
        return
    assert tier.num_free_blocks == tier.num_blocks and not any(tier.ref_count), "host blocks leaked"
    assert not tier.index and not tier.lru and not kv.block_keys
    assert not tier.swapped and not tier.traffic, "the tier kept a finished sequence's or request's record"


def generate(llm, prompts, params):
    """LLM.generate, stepping the engine by hand so the tiers are checked after every step; outputs in order."""
    engine = llm.engine
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = [f"t{next(_ids)}" for _ in prompts]
    for rid, p, sp in zip(ids, prompts, params):
        engine.add_request(rid, prompt_token_ids=p, params=sp)
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            assert o.error is None, o.error
            if o.finished:
                outs[o.request_id] = o
        check_tiers(engine)
    return [outs[rid] for rid in ids]


def tokens(outs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def greedy(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def run_chats(llm, chats, params=GREEDY) -> list:
    """Turn 1, turn 2, then turn 1 again: three rounds of outputs."""
    turn1, _, turn2, _ = chats
    return [generate(llm, ps, params) for ps in (turn1, turn2, turn1)]


def assert_tier_used(engine, config) -> None:
    stats = engine.kv.tier.stats
    if engine.prefix_cache is not None:
        assert stats.offloaded_blocks > 0 and stats.loaded_blocks > 0 and stats.hit_tokens > 0, stats
    mode = engine.config.preemption_mode
    if mode == "swap":
        assert stats.swap_preemptions > 0 and stats.swapped_in_blocks > 0, stats
    elif mode == "recompute":
        assert stats.recompute_preemptions > 0 and stats.swap_preemptions == 0 and stats.swapped_out_blocks == 0, stats
    else:
        assert stats.swap_preemptions + stats.recompute_preemptions > 0, stats


def no_tier(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ("kv_offloading_size", "preemption_mode")}


# -- greedy: transformers' tokens in every configuration ---------------------------------------------------
CONFIGS = [
    dict(prefix_cache="radix", preemption_mode="swap"),
    dict(prefix_cache="hash", preemption_mode="swap"),
    dict(prefix_cache="radix", preemption_mode="swap", block_size=1, num_kv_blocks=64),
    dict(prefix_cache="hash", preemption_mode="swap", block_size=3, num_kv_blocks=22),  # 3 divides few prompt lengths
    dict(prefix_cache="radix", preemption_mode="swap", attention="blockwise"),
    dict(prefix_cache="hash", preemption_mode="swap", attention="blockwise", block_size=3, num_kv_blocks=22),
    dict(prefix_cache="radix", preemption_mode="swap", max_num_batched_tokens=8),  # chunked prefill, mixed steps
    dict(prefix_cache="hash", preemption_mode="recompute"),
    dict(prefix_cache="radix", preemption_mode="recompute", max_num_batched_tokens=8),
    dict(prefix_cache=None, preemption_mode="swap"),  # no prefix cache: the tier holds swapped sequences only
    dict(prefix_cache="radix"),  # the default mode with a tier: "auto", by the measured rates
    dict(prefix_cache="hash", preemption_mode="swap", scheduler_policy="lpm"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_greedy_identical_to_transformers_with_the_tier_in_use(config, qwen2_dir, chats):
    _, ref1, _, ref2 = chats
    llm = LLM(str(qwen2_dir), dtype="float32", **{**TIER, **config})
    if "preemption_mode" not in config:
        assert llm.engine.config.preemption_mode == "auto"
    assert [greedy(r) for r in run_chats(llm, chats)] == [ref1, ref2, ref1]
    assert_tier_used(llm.engine, config)
    assert_all_free(llm.engine)


def test_n_greedy_samples_are_all_transformers_tokens(qwen2_dir, chats):
    _, ref1, _, ref2 = chats
    llm = LLM(str(qwen2_dir), dtype="float32", **TIER, prefix_cache="radix", preemption_mode="swap")
    params = SamplingParams(n=2, temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    assert [tokens(r) for r in run_chats(llm, chats, params)] == [[[r, r] for r in ref] for ref in (ref1, ref2, ref1)]
    assert_tier_used(llm.engine, {})
    assert_all_free(llm.engine)


@pytest.mark.parametrize("prefix_cache", ["radix", "hash"])
def test_seeded_samples_identical_with_and_without_the_tier(prefix_cache, qwen2_dir, chats):
    """n > 1 forks onto shared blocks (and a swapped-out parent's host blocks); each sample's seed fixes its tokens."""
    config = dict(TIER, prefix_cache=prefix_cache, preemption_mode="swap")
    params = SamplingParams(n=3, temperature=0.8, top_p=0.9, seed=7, max_tokens=MAX_NEW, ignore_eos=True)
    with_tier = LLM(str(qwen2_dir), dtype="float32", **config)
    got = [tokens(r) for r in run_chats(with_tier, chats, params)]
    want = [tokens(r) for r in run_chats(LLM(str(qwen2_dir), dtype="float32", **no_tier(config)), chats, params)]
    assert got == want
    assert any(len({tuple(s) for s in o}) > 1 for r in got for o in r), "the samples should differ"
    assert_tier_used(with_tier.engine, config)
    assert_all_free(with_tier.engine)


SPECULATION = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 3},
    "draft": {"method": "draft_model", "num_speculative_tokens": 2},  # the target as its own draft: its K/V is tiered too
}


@pytest.mark.parametrize("method, prefix_cache", [("ngram", "radix"), ("draft", "hash")])
def test_speculative_decoding_identical_with_the_tier(method, prefix_cache, qwen2_dir, chats):
    _, ref1, _, ref2 = chats
    spec = dict(SPECULATION[method])
    if method == "draft":
        spec["model"] = str(qwen2_dir)
    llm = LLM(str(qwen2_dir), dtype="float32", **TIER, prefix_cache=prefix_cache, preemption_mode="swap",
              speculative_config=spec)
    assert [greedy(r) for r in run_chats(llm, chats)] == [ref1, ref2, ref1]
    assert_tier_used(llm.engine, {})
    assert_all_free(llm.engine)


def test_beam_search_identical_with_and_without_the_tier(qwen2_dir, chats, hf, tokenizer):
    """Beams are forks: swapped out together, their host blocks shared, pruned ones freed while out."""
    turn1, _, turn2, _ = chats
    config = dict(TIER, prefix_cache="radix", preemption_mode="swap")
    beams = BeamSearchParams(3, MAX_NEW)
    prompts = [{"prompt_token_ids": p} for p in turn1 + turn2]
    llm = LLM(str(qwen2_dir), dtype="float32", **config)
    got = [[s.tokens for s in o.sequences] for o in llm.beam_search(prompts, beams)]
    again = [[s.tokens for s in o.sequences] for o in llm.beam_search(prompts, beams)]  # onto the cached prefixes
    plain = LLM(str(qwen2_dir), dtype="float32", **no_tier(config))
    want = [[s.tokens for s in o.sequences] for o in plain.beam_search(prompts, beams)]
    assert got == want and again == want
    assert want[0] == hf_beams(hf, turn1[0], beams, llm.engine.eos_token_ids, tokenizer.pad_token_id)[0]
    assert_tier_used(llm.engine, config)
    assert_all_free(llm.engine)


def test_beams_swapped_out_while_they_wait_for_their_siblings_come_back_with_nothing_to_recompute(qwen2_dir):
    """A beam that has computed all its tokens and waits for its siblings' rows is idle; preempted to make
    room (Scheduler._preempt_idle) by swapping, it keeps everything it computed, so when it is admitted
    again there is no token left to compute: it must not be scheduled as a 0-token prefill."""
    config = dict(block_size=4, num_kv_blocks=8, prefix_cache=None, kv_offloading_size=0.01, preemption_mode="swap")
    prompts = [{"prompt_token_ids": list(range(10 + i, 20 + i))} for i in range(2)]
    beams = BeamSearchParams(2, 4)
    llm = LLM(str(qwen2_dir), dtype="float32", **config)
    got = [[s.tokens for s in o.sequences] for o in llm.beam_search(prompts, beams)]
    plain = LLM(str(qwen2_dir), dtype="float32", **no_tier(config))
    assert got == [[s.tokens for s in o.sequences] for o in plain.beam_search(prompts, beams)]
    assert llm.engine.kv.tier.stats.swap_preemptions > 0
    assert_all_free(llm.engine)


def test_prompt_logprobs_requests_mixed_in(qwen2_dir, chats):
    """A request that scores its prompt takes no cache hit (the positions a hit skips are the rows it
    needs), from either tier; the others beside it still load from the host tier."""
    turn1, ref1, turn2, ref2 = chats
    scored = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, prompt_logprobs=2)
    mixed = [scored if i % 2 else GREEDY for i in range(len(turn1))]
    llm = LLM(str(qwen2_dir), dtype="float32", **TIER, prefix_cache="hash", preemption_mode="swap")
    rounds = [generate(llm, ps, mixed) for ps in (turn1, turn2, turn1)]
    assert [greedy(r) for r in rounds] == [ref1, ref2, ref1]
    want = {1: hf_scores(qwen2_dir, turn1), 2: hf_scores(qwen2_dir, turn2)}
    for outs, prompts, w in zip(rounds, (turn1, turn2, turn1), (want[1], want[2], want[1])):
        for i in (1, 3):
            score_error(outs[i].prompt_logprobs, prompts[i], w[i], k=2)
            assert outs[i].num_cached_tokens == 0
    assert sum(o.metrics.num_host_cached_tokens for r in rounds[1:] for o in r) > 0
    assert_tier_used(llm.engine, {})
    assert_all_free(llm.engine)


def host_gib(qwen2_dir, num_blocks: int, block_size: int) -> float:
    """kv_offloading_size for a host tier of exactly `num_blocks` blocks (float32 K and V, every layer)."""
    cfg = json.loads((qwen2_dir / "config.json").read_text())
    per_token = cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * (cfg["hidden_size"] // cfg["num_attention_heads"]) * 4
    return num_blocks * block_size * per_token / 2**30


@pytest.mark.parametrize("num_host_blocks, preemption", [(6, "recompute_preemptions"), (10, "swap_preemptions")])
def test_a_host_tier_too_small_to_keep_everything_drops_blocks_and_changes_nothing(num_host_blocks, preemption,
                                                                                  qwen2_dir, chats):
    """Its LRU drops blocks for good (they are recomputed); with 6 blocks no preempted sequence fits,
    so the swaps fall back to recompute; with 10 they fit."""
    _, ref1, _, ref2 = chats
    config = dict(TIER, kv_offloading_size=host_gib(qwen2_dir, num_host_blocks, 4), prefix_cache="radix",
                  preemption_mode="swap")
    llm = LLM(str(qwen2_dir), dtype="float32", **config)
    assert llm.engine.kv.tier.num_blocks == num_host_blocks
    assert [greedy(r) for r in run_chats(llm, chats)] == [ref1, ref2, ref1]
    stats = llm.engine.kv.tier.stats
    assert stats.dropped_blocks > 0 and stats.loaded_blocks > 0 and getattr(stats, preemption) > 0, stats
    assert_all_free(llm.engine)


def test_a_salted_request_never_loads_an_unsalted_prefix_from_the_host_tier(qwen2_dir, chats):
    turn1, ref1, _, _ = chats
    llm = LLM(str(qwen2_dir), dtype="float32", **TIER, prefix_cache="hash", preemption_mode="swap")
    tier = llm.engine.kv.tier
    salted = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, cache_salt="tenant-b")

    def one_at_a_time(params):
        return [generate(llm, [p], params)[0] for p in turn1]  # later chats push the earlier ones out to the host

    assert greedy(one_at_a_time(GREEDY)) == ref1
    assert tier.num_cached_blocks() > 0
    loaded = tier.stats.loaded_blocks
    outs = one_at_a_time(salted)  # the same prompts, under another salt: every block is in the tier, none is theirs
    assert greedy(outs) == ref1
    assert tier.stats.loaded_blocks == loaded and all(o.num_cached_tokens == 0 for o in outs)
    outs = one_at_a_time(salted)  # their own blocks, now evicted in turn: hits again
    assert greedy(outs) == ref1
    assert tier.stats.loaded_blocks > loaded and sum(o.metrics.num_host_cached_tokens for o in outs) > 0
    assert_all_free(llm.engine)


# -- settings ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, message", [
    (dict(kv_offloading_size=-1), r"kv_offloading_size=-1 must be a number of GiB >= 0"),
    (dict(kv_offloading_size="4GB"), r"kv_offloading_size='4GB' must be a number of GiB"),
    (dict(kv_offloading_size=True), r"kv_offloading_size=True must be a number of GiB"),
    (dict(kv_offloading_size=float("nan")), r"kv_offloading_size=nan must be a number of GiB"),
    (dict(kv_offloading_size=float("inf")), r"kv_offloading_size=inf must be a number of GiB"),
    (dict(kv_offloading_size=0.01, kv_cache="contiguous"), r"kv_offloading_size .*needs kv_cache='paged'"),
    (dict(kv_offloading_size=0.01, kv_cache="none"), r"kv_offloading_size .*needs kv_cache='paged'"),
    (dict(preemption_mode="swap"), r"preemption_mode='swap' .*kv_offloading_size > 0"),
    (dict(preemption_mode="auto"), r"preemption_mode='auto' .*kv_offloading_size > 0"),
    (dict(kv_offloading_size=0.01, preemption_mode="sometimes"), r"preemption_mode='sometimes' is invalid"),
    (dict(kv_offloading_size=0.01, kv_offloading_backend="lmcache"), r"kv_offloading_backend='lmcache' is invalid.*'native'"),
])
def test_bad_settings_are_value_errors_that_say_why(qwen2_dir, options, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(qwen2_dir), dtype="float32", **options)


def test_a_host_tier_too_small_for_one_block_is_refused(qwen2_dir):
    with pytest.raises(ValueError, match=r"kv_offloading_size=1e-09 GiB holds no KV block"):
        LLM(str(qwen2_dir), dtype="float32", block_size=4, kv_offloading_size=1e-9)


def test_without_a_tier_preemption_recomputes(qwen2_dir):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, num_kv_blocks=16)
    assert llm.engine.config.preemption_mode == "recompute" and llm.engine.offloader is None
