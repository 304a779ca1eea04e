"""Mixture-of-Experts models (Qwen3-MoE, OLMoE, Mixtral) against transformers, float32, greedy, token for token.

The models are random weights on real configs scaled down (tests/helpers/model_factory.py): the same top-k,
the same normalisation of the top-k weights and the same q/k norms, fewer layers and experts. Every
configuration of cache, attention and scheduling the dense parity tests run, tensor parallelism with the
experts cut both ways, and each feature that holds blocks or forks sequences.
"""
import httpx
import pytest
import torch

from nano_infer import LLM, BeamSearchParams, SamplingParams
from nano_infer.models.attention import AttentionMetadata, SeqSlice, make_backend
from nano_infer.spec import SpeculativeDecoder
from tests.helpers.beam_reference import hf_beams
from tests.helpers.engine_checks import serving
from tests.helpers.model_factory import MOE_FAMILIES, hf_model, make_moe_dir
from tests.helpers.parity import CONFIGS, GREEDY, prompts, reference

LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokenizer):
    """family -> (folder, prompts, transformers' greedy tokens), each made once for the module."""
    made = {}

    def get(family):
        if family not in made:
            folder = make_moe_dir(family, tmp_path_factory.mktemp(family), tokenizer)
            ps = prompts(tokenizer)
            made[family] = folder, ps, reference(folder, ps)
        return made[family]
    return get


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def moe(request, built):
    return built(request.param)


@pytest.fixture(scope="module")
def qwen3_moe(built):
    return built("qwen3_moe")


def token_ids(outs):
    return [o.outputs[0].token_ids for o in outs]


def assert_blocks_free(llm):
    kv = llm.engine.kv
    if llm.engine.prefix_cache is not None:
        kv.clear()
    assert kv.num_free_blocks == kv.num_blocks and not any(kv.ref_count), "KV blocks leaked"


def test_logits_match_transformers(moe):
    folder, ps, _ = moe
    llm = LLM(str(folder), dtype="float32", kv_cache="none")
    ids = torch.tensor(ps[1])
    backend = make_backend("dense", None)
    backend.meta = AttentionMetadata(slot_mapping=None, prefills=[SeqSlice(0, len(ids), len(ids))])
    with torch.no_grad():
        ours = llm.engine.model.compute_logits(llm.engine.model(ids, torch.arange(len(ids)), backend))
        theirs = hf_model(folder)(ids[None]).logits[0]
    assert torch.allclose(ours, theirs, atol=LOGIT_ATOL, rtol=0), (ours - theirs).abs().max()


def test_the_random_models_route_and_write_like_real_ones(moe):
    """Greedy text that varies, and a router that spreads a prompt's tokens over most experts: otherwise
    token-identical would check little."""
    folder, ps, ref = moe
    assert all(len(set(r)) >= 4 for r in ref), ref
    llm = LLM(str(folder), dtype="float32", kv_cache="none")
    block = next(m for m in llm.engine.model.modules() if type(m).__name__ == "SparseMoeBlock")
    hidden = llm.engine.model.embed_tokens(torch.tensor(sum(ps, [])))
    _, experts = block.gate(hidden).topk(block.top_k)
    assert len(experts.unique()) >= 0.75 * block.gate.out_features


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_greedy_identical_for_every_configuration(config, moe):
    folder, ps, ref = moe
    llm = LLM(str(folder), dtype="float32", **config)
    assert token_ids(llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)) == ref
    if llm.engine.prefix_cache is not None:  # again, from the cache
        second = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
        assert token_ids(second) == ref and sum(o.num_cached_tokens for o in second) > 0
    if llm.engine.kv is not None:
        assert_blocks_free(llm)


def test_speculation_host_tier_and_constraints_leave_the_tokens_unchanged(qwen3_moe, tokenizer):
    folder, ps, ref = qwen3_moe
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    spec = LLM(str(folder), dtype="float32", block_size=4, speculative_config=ngram)
    assert token_ids(spec.generate(prompt_token_ids=ps, sampling_params=GREEDY)) == ref
    assert spec.engine.plugin(SpeculativeDecoder).stats.num_accepted_tokens > 0
    tier = LLM(str(folder), dtype="float32", block_size=4, num_kv_blocks=16, kv_offloading_size=0.01,
               preemption_mode="swap", prefix_cache=None)
    outs = tier.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    assert token_ids(outs) == ref and sum(o.metrics.num_preemptions for o in outs) > 0
    assert_blocks_free(tier)
    choices = ["yes", "no", "maybe"]
    picked = spec.generate(["Answer:"] * 2, SamplingParams(temperature=0, max_tokens=8, choice=choices))
    assert all(o.outputs[0].text in choices for o in picked)


def test_beams_match_transformers(qwen3_moe):
    folder, ps, _ = qwen3_moe
    llm = LLM(str(folder), dtype="float32", block_size=4)
    params = BeamSearchParams(beam_width=3, max_tokens=8)
    short = [p[:6] for p in ps[:2]]
    found = llm.beam_search([{"prompt_token_ids": p} for p in short], params)
    hf = hf_model(folder)
    expected = [hf_beams(hf, p, params, llm.engine.eos_token_ids, llm.tokenizer.pad_token_id)[0] for p in short]
    assert [[s.tokens for s in o.sequences] for o in found] == expected
    assert_blocks_free(llm)


def test_the_server_answers_what_the_engine_generates(qwen3_moe, tokenizer):
    folder, ps, ref = qwen3_moe
    with serving(folder) as (_, server):
        body = {"prompt": ps[0], "max_tokens": len(ref[0]), "temperature": 0, "ignore_eos": True, "logprobs": 0}
        reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == tokenizer.decode(ref[0])


@pytest.mark.slow
@pytest.mark.parametrize("family, expert_parallel", [("qwen3_moe", False), ("mixtral", True), ("olmoe", True)],
                         ids=["qwen3_moe-experts-sliced", "mixtral-expert-parallel", "olmoe-expert-parallel"])
def test_tp2_matches_transformers(family, expert_parallel, built):
    """Tensor parallelism with every expert's features split, or (expert parallelism) half the experts whole on each
    rank (Mixtral's checkpoint names its experts w1/w2/w3); OLMoE's q/k norm then sums its squares over both ranks'
    heads."""
    folder, ps, ref = built(family)
    with LLM(str(folder), dtype="float32", tensor_parallel_size=2, enable_expert_parallel=expert_parallel,
             block_size=4, max_num_batched_tokens=8) as llm:
        assert token_ids(llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)) == ref
