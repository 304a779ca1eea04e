"""The parity oracle's shared pieces: the prompts, transformers' greedy tokens for them, and the engine configurations every parity check runs."""
import torch

from nano_infer import SamplingParams
from tests.helpers.model_factory import hf_model

MAX_NEW = 24
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)


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
    dict(block_size=4, enforce_eager=False),  # decode steps of up to 4 sequences compiled (engine/compiled_decode.py)
]
