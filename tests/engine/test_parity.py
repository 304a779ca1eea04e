"""The correctness oracle: transformers, same weights, float32, greedy, token for token.

Every configuration of cache, attention and scheduling must give the same tokens.
"""
import pytest
import torch

from model_factory import hf_model
from nano_infer import LLM, LLMEngine, SamplingParams
from nano_infer.models.attention import AttentionMetadata, SeqSlice, make_backend

MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
LOGIT_ATOL = 1e-4  # float32; observed differences are ~1e-6


def prompts(tokenizer):
    shared = tokenizer.encode("To be, or not to be, that is the question: whether 'tis nobler in the mind")
    return [
        shared + tokenizer.encode(" to suffer"),
        shared + tokenizer.encode(" the quick brown fox jumps"),
        shared,  # a prefix of the others: a whole-prompt cache hit on the second run
        tokenizer.encode("你好，世界！ 🙂"),
        tokenizer.encode("def f(x): return x * 2  # code and more code here"),
    ]


def reference(model_dir, token_lists):
    hf = hf_model(model_dir)
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() for p in token_lists]


@pytest.fixture(scope="module")
def qwen2_reference(qwen2_dir, tokenizer):
    ps = prompts(tokenizer)
    return ps, reference(qwen2_dir, ps)


def test_logits_match_transformers(model_dir, tokenizer):
    engine = LLMEngine(str(model_dir), dtype="float32", kv_cache="none")
    ids = torch.tensor(prompts(tokenizer)[1])
    backend = make_backend("dense", None)
    backend.meta = AttentionMetadata(slot_mapping=None, prefills=[SeqSlice(0, len(ids), len(ids))])
    with torch.no_grad():  # the engine on its device (the GPU where there is one), transformers on the CPU
        dev = engine.device
        ours = engine.model.compute_logits(engine.model(ids.to(dev), torch.arange(len(ids), device=dev), backend)).cpu()
        theirs = hf_model(model_dir)(ids[None]).logits[0]
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, atol=LOGIT_ATOL, rtol=0), (ours - theirs).abs().max()


def test_greedy_matches_transformers_for_each_family(model_dir, tokenizer):
    ps = prompts(tokenizer)
    ref = reference(model_dir, ps)
    assert all(len(set(r)) >= 4 for r in ref), f"random model too repetitive for a meaningful check: {ref}"
    outs = LLM(str(model_dir), dtype="float32").generate(prompt_token_ids=ps, sampling_params=GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == ref
    assert [o.prompt_token_ids for o in outs] == ps


CONFIGS = [
    dict(kv_cache="none"),
    dict(kv_cache="contiguous"),
    dict(kv_cache="paged", block_size=16, prefix_cache=None),
    dict(kv_cache="paged", block_size=1, prefix_cache=None),
    dict(kv_cache="paged", block_size=7, prefix_cache=None),  # divides none of the prompt lengths
    dict(block_size=7, prefix_cache="hash"),
    dict(block_size=4, prefix_cache="radix"),
    dict(block_size=4, prefix_cache="radix", attention="blockwise"),
    dict(block_size=3, prefix_cache="hash", attention="blockwise"),
    dict(block_size=4, max_num_batched_tokens=8),  # chunked prefill, mixed steps
    dict(block_size=4, num_kv_blocks=16, prefix_cache=None),  # preemption
    dict(block_size=4, num_kv_blocks=16, prefix_cache="hash"),  # preemption + eviction
    dict(block_size=4, num_kv_blocks=16, prefix_cache="radix"),
    dict(scheduler="static", max_num_seqs=2),
    dict(scheduler_policy="lpm", prefix_cache="radix", block_size=4),
    dict(max_num_seqs=2, block_size=4, max_num_batched_tokens=5, attention="blockwise"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_greedy_identical_for_every_configuration(config, qwen2_dir, qwen2_reference):
    ps, ref = qwen2_reference
    llm = LLM(str(qwen2_dir), dtype="float32", **config)
    first = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    second = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)  # with a prefix cache: hits now
    assert [o.outputs[0].token_ids for o in first] == ref
    assert [o.outputs[0].token_ids for o in second] == ref
    engine = llm.engine
    if engine.prefix_cache is not None:
        assert sum(o.num_cached_tokens for o in second) > 0
        engine.kv.clear()
    if engine.kv is not None:
        assert engine.kv.num_free_blocks == engine.kv.num_blocks, "KV blocks leaked"
        assert all(r == 0 for r in engine.kv.ref_count)


def test_preemption_happens_and_output_is_unchanged(qwen2_dir, qwen2_reference):
    ps, ref = qwen2_reference
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, num_kv_blocks=16, prefix_cache=None)
    outs = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert [o.outputs[0].token_ids for o in outs] == ref


def test_chunked_prefill_mixes_prefill_and_decode_in_one_step(qwen2_dir, tokenizer):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, max_num_batched_tokens=6, record_steps=True)
    llm.generate(prompt_token_ids=prompts(tokenizer)[:3], sampling_params=GREEDY)
    kinds = [{kind for *_, kind in rec.scheduled} for rec in llm.engine.history]
    assert any(k == {"prefill", "decode"} for k in kinds)
    assert all(sum(n for _, _, n, _ in rec.scheduled) <= 6 for rec in llm.engine.history)
