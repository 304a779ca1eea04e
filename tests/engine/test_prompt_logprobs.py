"""Prompt logprobs (SamplingParams.prompt_logprobs): transformers' log_softmax of the prompt, in float32,
for each model family and the shipped model, in every cache and scheduling configuration."""
import pytest

from nano_infer import LLM, SamplingParams, default_model
from tests.helpers.parity import CONFIGS, GREEDY, MAX_NEW, prompts, reference
from tests.helpers.prompt_scores import K, hf_scores, score_error

SCORED = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, prompt_logprobs=K)


def assert_blocks_free(llm) -> None:
    kv = llm.engine.kv
    if kv is not None:
        kv.clear()
        assert kv.num_free_blocks == kv.num_blocks and not any(kv.ref_count), "KV blocks leaked"


@pytest.fixture(scope="module")
def qwen2_case(qwen2_dir, tokenizer):
    ps = prompts(tokenizer)
    return ps, reference(qwen2_dir, ps), hf_scores(qwen2_dir, ps)


@pytest.mark.parametrize("config", [dict(), dict(block_size=4, max_num_batched_tokens=8)], ids=["default", "chunked"])
def test_prompt_logprobs_equal_transformers_for_each_family(model_dir, tokenizer, config):
    ps = prompts(tokenizer)
    want = hf_scores(model_dir, ps)
    llm = LLM(str(model_dir), dtype="float32", **config)
    outs = llm.generate(prompt_token_ids=ps, sampling_params=SCORED)
    for out, p, w in zip(outs, ps, want):
        score_error(out.prompt_logprobs, p, w)
    plain = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
    assert all(o.prompt_logprobs is None for o in plain)
    assert_blocks_free(llm)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_prompt_logprobs_and_greedy_parity_in_every_configuration(config, qwen2_dir, qwen2_case):
    """Prompts first run without scores fill the prefix cache; scored, they must be computed anew."""
    ps, ref, want = qwen2_case
    llm = LLM(str(qwen2_dir), dtype="float32", **config)
    assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)] == ref
    scored = llm.generate(prompt_token_ids=ps, sampling_params=SCORED)
    assert [o.outputs[0].token_ids for o in scored] == ref
    for out, p, w in zip(scored, ps, want):
        score_error(out.prompt_logprobs, p, w)
    if llm.engine.prefix_cache is not None:
        assert all(o.num_cached_tokens == 0 for o in scored)  # no hit skipped a row
        again = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
        assert sum(o.num_cached_tokens for o in again) > 0  # ... though the cache held the prompts
    assert_blocks_free(llm)


@pytest.mark.parametrize("prefix_cache", [None, "radix"])
def test_preempted_while_scoring_the_prompt_scores_it_once(qwen2_dir, qwen2_case, prefix_cache, monkeypatch):
    ps, ref, want = qwen2_case
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, num_kv_blocks=16, max_num_batched_tokens=8,
              prefix_cache=prefix_cache)
    scheduler, scoring = llm.engine.scheduler, []
    preempt = scheduler._preempt
    monkeypatch.setattr(scheduler, "_preempt", lambda seq: (scoring.append(seq.scores_prompt), preempt(seq)))
    outs = llm.generate(prompt_token_ids=ps, sampling_params=SCORED)
    assert any(scoring) and not all(scoring), scoring  # preempted mid-prompt, and after it
    assert [o.outputs[0].token_ids for o in outs] == ref
    for out, p, w in zip(outs, ps, want):
        score_error(out.prompt_logprobs, p, w)
    assert_blocks_free(llm)


def test_samples_speculation_and_k_zero(qwen2_dir, qwen2_case):
    ps, ref, want = qwen2_case
    sampled = LLM(str(qwen2_dir), dtype="float32", block_size=4).generate(
        prompt_token_ids=ps[:2], sampling_params=SamplingParams(n=3, temperature=0.8, seed=1, max_tokens=4,
                                                               prompt_logprobs=1))
    for out, p, w in zip(sampled, ps, want):
        assert len(out.outputs) == 3
        score_error(out.prompt_logprobs, p, w, k=1)
    spec = LLM(str(qwen2_dir), dtype="float32", block_size=4,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    outs = spec.generate(prompt_token_ids=ps, sampling_params=SCORED)
    assert [o.outputs[0].token_ids for o in outs] == ref
    for out, p, w in zip(outs, ps, want):
        score_error(out.prompt_logprobs, p, w)
    bare = spec.generate(prompt_token_ids=ps[:1], sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert [list(e) for e in bare.prompt_logprobs[1:]] == [[t] for t in ps[0][1:]]  # k=0: the token itself


@pytest.mark.parametrize("config", [dict(), dict(max_num_batched_tokens=16, block_size=4), dict(prefix_cache="hash")],
                         ids=["default", "chunked", "hash"])
def test_prompt_logprobs_of_the_shipped_model(config):
    model = default_model()
    llm = LLM(model, dtype="float32", **config)
    texts = ["To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer",
             "O Romeo, Romeo, wherefore art thou Romeo? Deny thy father and refuse thy name"]
    ps = [llm.tokenizer.encode(t) for t in texts]
    llm.generate(prompt_token_ids=[ps[0] + ps[1]], sampling_params=GREEDY)  # a cached prefix for the hash run
    outs = llm.generate(texts, SamplingParams(max_tokens=1, prompt_logprobs=5))
    for out, p, w in zip(outs, ps, hf_scores(model, ps)):
        assert out.prompt_token_ids == p
        score_error(out.prompt_logprobs, p, w, k=5)
    assert_blocks_free(llm)


def test_a_step_scores_a_bounded_slice_of_prompt_rows(qwen2_dir, monkeypatch):
    """Three prompts of 500 tokens scored, 64 rows a step: no step normalizes more (all 1,497 fit the token
    budget of one step), and the scores still equal transformers'. The engine's bound is a number of logits:
    a 152,064-token vocabulary scores 55 rows a step."""
    from nano_infer.engine.scheduler import scored_rows_per_step

    assert scored_rows_per_step(152_064) == 55 and scored_rows_per_step(2**24) == 1
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4)
    scheduler, rows = llm.engine.scheduler, []
    assert scheduler.max_scored_rows == scored_rows_per_step(llm.engine.vocab_size)
    scheduler.max_scored_rows = 64
    schedule = scheduler.schedule

    def recording():
        out = schedule()
        rows.append(sum(e.num_prompt_logit_rows for e in out.scheduled))
        return out

    monkeypatch.setattr(scheduler, "schedule", recording)
    ps = [[5 + (i * 7 + j * 13) % 440 for j in range(500)] for i in range(3)]
    outs = llm.generate(prompt_token_ids=ps, sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=K))
    assert sum(rows) == 3 * 499 and max(rows) <= 64, rows
    for out, p, w in zip(outs, ps, hf_scores(qwen2_dir, ps)):
        score_error(out.prompt_logprobs, p, w)
    assert_blocks_free(llm)
