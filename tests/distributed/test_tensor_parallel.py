"""Tensor parallelism on CPU with gloo: the tokens of one process and of transformers, and faults that fail fast.

Each engine spawns worker processes that import torch, so one engine serves several checks.
The random qwen2 model has 4 query heads and 2 KV heads: tp=2 splits the KV heads, tp=4
replicates each on two ranks.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import psutil
import pytest
import torch
import torch.distributed as dist

from nano_infer import LLM, BeamSearchParams, SamplingParams
from nano_infer.distributed import TPShard, check_tp_sizes
from nano_infer.models.loader import load_config, load_model
from tests.helpers.beam_reference import hf_beams
from tests.helpers.model_factory import hf_model, make_model_dir
from tests.helpers.parity import GREEDY, prompts, reference


@pytest.fixture(scope="module")
def qwen2_ref(qwen2_dir, tokenizer):
    ps = prompts(tokenizer)
    return ps, reference(qwen2_dir, ps)


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}


def gone(pids, within: float = 30.0) -> bool:
    """Every pid has exited (polled; the bound only keeps a broken run from hanging)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


# -- sizes and slices (no processes) ------------------------------------------------------------------
def shape(**overrides):
    base = dict(num_attention_heads=8, num_key_value_heads=2, intermediate_size=512, vocab_size=4096)
    return SimpleNamespace(**{**base, **overrides})


@pytest.mark.parametrize("overrides, size, constraint", [
    ({}, 16, "must divide num_attention_heads=8"),  # more ranks than heads
    ({}, 3, "must divide num_attention_heads=8"),
    ({"num_key_value_heads": 4, "num_attention_heads": 12}, 3, "one must divide the other"),
    ({"intermediate_size": 510}, 4, "must divide intermediate_size=510"),
    ({}, 0, "must be an integer >= 1"),
])
def test_a_bad_size_names_the_constraint(overrides, size, constraint):
    with pytest.raises(ValueError, match=constraint):
        check_tp_sizes(shape(**overrides), size)


def test_llm_refuses_a_bad_size_before_starting_a_process(qwen2_dir):
    before = children()
    with pytest.raises(ValueError, match="tensor_parallel_size=8 must divide num_attention_heads=4"):
        LLM(str(qwen2_dir), dtype="float32", tensor_parallel_size=8)
    assert children() == before and not dist.is_initialized()


@pytest.mark.parametrize("heads, kv_heads, size", [(8, 2, 2), (8, 2, 4), (8, 2, 8), (8, 8, 4), (12, 4, 2), (14, 2, 2)])
def test_each_rank_holds_the_kv_heads_its_query_heads_read(heads, kv_heads, size):
    cfg = shape(num_attention_heads=heads, num_key_value_heads=kv_heads)
    check_tp_sizes(cfg, size)
    group = heads // kv_heads
    owners = {}
    for rank in range(size):
        tp = TPShard(rank, size)
        q0, nq = tp.q_heads(cfg)
        k0, nk = tp.kv_heads(cfg)
        for j in range(nq):  # local query head j reads local KV head j // (nq // nk), as fold_gqa groups them
            assert (q0 + j) // group == k0 + j // (nq // nk)
            owners.setdefault(q0 + j, []).append(rank)
    assert owners == {h: [h // (heads // size)] for h in range(heads)}  # every query head on exactly one rank


@pytest.mark.parametrize("size", [2, 4])
def test_the_shards_of_every_weight_put_back_together_give_the_weight(qwen2_dir, size):
    """Fused q/k/v and gate/up are cut per part, not as one tensor: the ranks' pieces rebuild each part."""
    cfg = load_config(qwen2_dir)
    full = load_model(qwen2_dir, cfg, torch.device("cpu"), torch.float32, 64).state_dict()
    shards = [load_model(qwen2_dir, cfg, torch.device("cpu"), torch.float32, 64, TPShard(r, size)).state_dict()
              for r in range(size)]
    D, H, KV = 16, cfg.num_attention_heads, cfg.num_key_value_heads
    for name, weight in full.items():
        parts = [s[name] for s in shards]
        if "qkv_proj" in name:
            q, k, v = weight.split([H * D, KV * D, KV * D])
            for r, part in enumerate(parts):
                q0, nq = TPShard(r, size).q_heads(cfg)
                k0, nk = TPShard(r, size).kv_heads(cfg)
                lq, lk, lv = part.split([nq * D, nk * D, nk * D])
                assert torch.equal(lq, q[q0 * D : (q0 + nq) * D])
                assert torch.equal(lk, k[k0 * D : (k0 + nk) * D]) and torch.equal(lv, v[k0 * D : (k0 + nk) * D])
        elif "gate_up_proj" in name:
            gate, up = weight.chunk(2)
            assert torch.equal(torch.cat([p.chunk(2)[0] for p in parts]), gate)
            assert torch.equal(torch.cat([p.chunk(2)[1] for p in parts]), up)
        elif "o_proj" in name or "down_proj" in name:
            assert torch.equal(torch.cat(parts, dim=1), weight)
        elif "embed_tokens" in name:  # the vocabulary (451 tokens) does not divide: the last slice is padded
            rows = -(-cfg.vocab_size // size)
            assert all(p.shape[0] == rows for p in parts) and not torch.cat(parts)[cfg.vocab_size:].any()
            assert torch.equal(torch.cat(parts)[: cfg.vocab_size], weight)
        else:  # norms: every rank holds all of it
            assert all(torch.equal(p, weight) for p in parts), name


# -- the engine across processes ----------------------------------------------------------------------
@pytest.mark.slow
def test_tp2_matches_one_process_and_transformers_with_preemption_prefix_cache_chunked_prefill_and_beams(qwen2_dir, qwen2_ref):
    ps, ref = qwen2_ref
    config = dict(block_size=4, num_kv_blocks=16, prefix_cache="radix", max_num_batched_tokens=8)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, n=2, seed=7, max_tokens=12)
    single = LLM(str(qwen2_dir), dtype="float32", **config)
    expected_sampled = tokens(single.generate(prompt_token_ids=ps[:3], sampling_params=sampled))
    beams, short = BeamSearchParams(3, 8), [p[:6] for p in ps[:2]]
    expected_beams = [hf_beams(hf_model(qwen2_dir), p, beams, single.engine.eos_token_ids,
                               single.tokenizer.pad_token_id)[0] for p in short]
    with LLM(str(qwen2_dir), dtype="float32", tensor_parallel_size=2, **config) as llm:
        pids = llm.engine.executor.worker_pids
        assert len(pids) == 1 and pids[0] in children()
        first = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
        second = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)  # prompts now hit the radix tree
        assert [o.outputs[0].token_ids for o in first] == ref
        assert [o.outputs[0].token_ids for o in second] == ref
        assert sum(o.metrics.num_preemptions for o in first + second) > 0
        assert sum(o.num_cached_tokens for o in second) > 0
        assert tokens(llm.generate(prompt_token_ids=ps[:3], sampling_params=sampled)) == expected_sampled
        found = llm.beam_search([{"prompt_token_ids": p} for p in short], beams)  # forks on both ranks' blocks
        assert [[s.tokens for s in o.sequences] for o in found] == expected_beams
        engine = llm.engine
        engine.kv.clear()
        assert engine.kv.num_free_blocks == engine.kv.num_blocks and not any(engine.kv.ref_count)
    # closed: the worker has exited, the process group is gone, the engine says so
    assert gone(pids) and not dist.is_initialized()
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(prompt_token_ids=ps[:1], sampling_params=GREEDY)
    llm.close()  # twice is fine


@pytest.mark.slow
def test_tp2_with_a_host_tier_swaps_and_loads_every_ranks_shard(qwen2_dir, qwen2_ref):
    """Stage 12 across processes: each rank copies its shard of the same blocks between its two pools."""
    ps, ref = qwen2_ref
    config = dict(block_size=4, num_kv_blocks=16, prefix_cache="radix", max_num_batched_tokens=8,
                  kv_offloading_size=0.01, preemption_mode="swap")
    sampled = SamplingParams(temperature=0.8, top_p=0.9, n=2, seed=7, max_tokens=12)
    expected_sampled = tokens(LLM(str(qwen2_dir), dtype="float32", **config).generate(prompt_token_ids=ps[:3],
                                                                                      sampling_params=sampled))
    with LLM(str(qwen2_dir), dtype="float32", tensor_parallel_size=2, **config) as llm:
        assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)] == ref
        # reversed: the first prompts' prefixes were evicted to the host tier meanwhile, and load back
        assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps[::-1], sampling_params=GREEDY)] \
            == ref[::-1]
        assert tokens(llm.generate(prompt_token_ids=ps[:3], sampling_params=sampled)) == expected_sampled
        kv = llm.engine.kv
        stats = kv.tier.stats
        assert stats.swap_preemptions > 0 and stats.swapped_in_blocks > 0 and stats.loaded_blocks > 0, stats
        kv.clear()
        assert kv.num_free_blocks == kv.num_blocks and not any(kv.ref_count)
        assert kv.tier.num_free_blocks == kv.tier.num_blocks and not any(kv.tier.ref_count)


@pytest.mark.slow
def test_tp4_replicated_kv_heads_blockwise_hash_cache_and_a_hung_worker(qwen2_dir, qwen2_ref):
    ps, ref = qwen2_ref
    llm = LLM(str(qwen2_dir), dtype="float32", tensor_parallel_size=4, block_size=7, prefix_cache="hash", attention="blockwise",
              distributed_timeout=5)
    assert llm.engine.model.num_kv_heads == 1  # 2 KV heads over 4 ranks: one each, each held twice
    for _ in range(2):
        assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)] == ref
    time.sleep(6)  # idle for longer than the timeout: workers waiting for the next step is not a fault
    assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps[:2], sampling_params=GREEDY)] == ref[:2]
    pids = llm.engine.executor.worker_pids
    os.kill(pids[1], signal.SIGSTOP)  # alive, but never answers: only the collective's timeout can tell
    with pytest.raises(RuntimeError, match=rf"step failed: a collective timed out after 5 s;.* worker rank 2 \(pid {pids[1]}\) is still running"):
        llm.generate(prompt_token_ids=ps[:2], sampling_params=GREEDY)
    assert gone(pids) and not dist.is_initialized()  # the stopped worker too
    assert not llm.engine.requests and llm.engine.kv.num_free_blocks + llm.engine.prefix_cache.num_evictable_blocks() \
        == llm.engine.kv.num_blocks  # the failed step's requests were aborted and gave their blocks back
    with pytest.raises(RuntimeError, match="create a new LLM"):
        llm.generate(prompt_token_ids=ps[:1], sampling_params=GREEDY)


@pytest.mark.slow
def test_tp2_contiguous_cache_then_a_killed_worker_fails_the_next_step(qwen2_dir, qwen2_ref):
    ps, ref = qwen2_ref
    llm = LLM(str(qwen2_dir), dtype="float32", tensor_parallel_size=2, kv_cache="contiguous", max_model_len=128)
    assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)] == ref
    pid = llm.engine.executor.worker_pids[0]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"worker rank 1 \(pid {pid}\) exited with code -9"):
        llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    assert gone([pid]) and not dist.is_initialized() and pid not in children()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_tp2_matches_transformers_for_other_families(family, tmp_path, tokenizer):
    """qwen3: q/k norms and an explicit head_dim; llama: llama3 RoPE and an untied LM head, cut by vocabulary."""
    folder = make_model_dir(family, tmp_path, tokenizer)
    ps = prompts(tokenizer)[:3]
    with LLM(str(folder), dtype="float32", tensor_parallel_size=2, prefix_cache=None) as llm:
        assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)] \
            == reference(folder, ps)


DRIVER = """
import signal
import sys
import torch
from nano_infer import LLM, BeamSearchParams, SamplingParams
if __name__ == "__main__":
    # as in a terminal: a launcher that runs the tests in the background leaves SIGINT ignored, and children inherit that
    signal.signal(signal.SIGINT, signal.default_int_handler)
    llm = LLM(sys.argv[1], dtype="float32", tensor_parallel_size=2, distributed_timeout=30)
    print(*llm.engine.executor.worker_pids, flush=True)
    while True:
        llm.generate(["To be, or not to be"] * 4, SamplingParams(max_tokens=32, ignore_eos=True))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_a_driver_that_is_interrupted_or_killed_leaves_no_worker_behind(qwen2_dir, tmp_path, sig):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    driver = subprocess.Popen([sys.executable, str(script), str(qwen2_dir)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 1 and psutil.pid_exists(pids[0])
        time.sleep(0.5)  # mid-generation
        driver.send_signal(sig)
        driver.wait(timeout=120)  # a collective the signal interrupted fails within distributed_timeout
        assert gone(pids)
    finally:
        driver.kill()
        driver.wait()
