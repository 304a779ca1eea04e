"""The correctness oracle: transformers, same weights, float32, greedy, token for token.

Every configuration of cache, attention and scheduling must give the same tokens.
"""
import pytest
import torch

from nano_infer import LLM, LLMEngine
from nano_infer.models.attention import AttentionMetadata, SeqSlice, make_backend
from tests.helpers.model_factory import hf_model
from tests.helpers.parity import CONFIGS, GREEDY, prompts, reference

LOGIT_ATOL = 1e-4  # float32; observed differences are ~1e-6


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
