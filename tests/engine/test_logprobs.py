"""logprobs: the sampled token's log-probability and the k most likely, equal to transformers' distribution."""
import torch

from nano_infer import LLM, SamplingParams
from tests.helpers.model_factory import hf_model


def test_logprobs_match_transformers(qwen2_dir, tokenizer):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4)
    prompt = tokenizer.encode("To be, or not to be, that is")
    params = SamplingParams(temperature=0.9, seed=3, max_tokens=6, ignore_eos=True, logprobs=3, n=2)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    hf = hf_model(qwen2_dir)
    for sample in out.outputs:
        ids = prompt + sample.token_ids
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)[len(prompt) - 1 : -1]
        assert len(sample.logprobs) == len(sample.token_ids) == 6
        for row, token, entry in zip(want, sample.token_ids, sample.logprobs):
            top = row.topk(3)
            assert set(top.indices.tolist()) | {token} == set(entry)
            assert entry[token].rank == int((row > row[token]).sum()) + 1
            for tid, lp in entry.items():
                assert abs(lp.logprob - row[tid].item()) < 1e-4
            assert [entry[t].rank for t in top.indices.tolist()] == [1, 2, 3]


def test_no_logprobs_unless_asked(qwen2_dir):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4)
    out = llm.generate(["To be"], SamplingParams(max_tokens=3, logprobs=0, ignore_eos=True))[0].outputs[0]
    assert [len(e) for e in out.logprobs] == [1, 1, 1] and list(out.logprobs[0]) == out.token_ids[:1]
    assert llm.generate(["To be"], SamplingParams(max_tokens=3))[0].outputs[0].logprobs is None
