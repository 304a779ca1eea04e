"""Captured decode steps (engine/cuda_graph.py): the buckets, the padding, the static buffers.

On a CPU nothing is captured, but `capture=False` runs the very step a graph would record: the
inputs copied into static buffers, padded to the bucket by repeating the first sequence, the mask
computed from the context lengths inside the step. Its logits must equal the eager step's for every
real row, across bucket changes (batch sizes 1 -> 3 -> 5, block tables growing past a power of two),
and the padding must write nothing a real sequence reads. scripts/gpu_check.sh runs the captured
path itself on a GPU.
"""
import torch
from hypothesis import given, strategies as st

from nano_infer import LLM, SamplingParams
from nano_infer.engine.cuda_graph import BATCH_BUCKETS, batch_bucket, width_bucket


@given(st.integers(1, BATCH_BUCKETS[-1] + 50))
def test_batch_bucket_is_the_smallest_that_holds(n):
    b = batch_bucket(n)
    if n > BATCH_BUCKETS[-1]:
        assert b is None
    else:
        assert b >= n and all(smaller < n for smaller in BATCH_BUCKETS if smaller < b)


@given(st.integers(1, 4096), st.integers(1, 4096))
def test_width_bucket_is_a_power_of_two_at_most_twice_the_need(n, max_blocks):
    n = min(n, max_blocks)
    w = width_bucket(n, max_blocks)
    assert n <= w <= max_blocks
    assert w == max_blocks or (w & (w - 1) == 0 and w < 2 * n + (n == 1))


def run(model_dir, prompts, padded: bool):
    llm = LLM(str(model_dir), dtype="float32", block_size=4, max_model_len=96, enforce_eager=True)
    runner = llm.engine.runner
    if padded:
        runner.capture_decode(llm.engine.max_model_len, capture=False)
    # the replies end 4 tokens apart, so decode-only steps run 5, 4, 3, 2 and 1 sequences (buckets 8, 4, 2, 1)
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0, max_tokens=28 - 4 * i, ignore_eos=True, logprobs=2)
        llm.engine.add_request(str(i), prompt_token_ids=p, params=params)
    outs = {}
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0]
    return [outs[str(i)] for i in range(len(prompts))], runner


def test_padded_static_step_equals_eager(model_dir, tokenizer):
    prompts = [tokenizer.encode(t) for t in ("Hello there", "The quick brown fox jumps over", "1 2 3",
                                             "A longer prompt that needs a few blocks of four tokens", "x")]
    eager, _ = run(model_dir, prompts, padded=False)
    padded, runner = run(model_dir, prompts, padded=True)
    batches = {b for b, _ in runner.graphs.steps}
    widths = {w for _, w in runner.graphs.steps}
    assert {1, 2, 4, 8} <= batches and len(widths) >= 2  # the buckets changed on the way in both sizes
    for e, p in zip(eager, padded):
        assert p.token_ids == e.token_ids
        for le, lp in zip(e.logprobs, p.logprobs):
            for t in le:
                assert abs(le[t].logprob - lp[t].logprob) < 1e-4
