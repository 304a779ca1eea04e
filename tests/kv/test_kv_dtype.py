"""kv_cache_dtype (chapter 14): 8-bit K/V with a float16 scale per token and head.

What is checked: the quantizer's error bound (any input, hypothesis), what the pool holds for a byte budget,
attention through a quantized pool against attention over the same K/V rounded by hand, accuracy on the real
SmolLM2 and on a random model with an outlier channel planted in K, and that every feature that holds blocks
(prefix caches, the host tier, beams, speculation, tensor parallelism) gives the tokens int8 KV gives without it.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from nano_infer import LLM, BeamSearchParams, SamplingParams
from nano_infer.bench import kv_dtype as bench
from nano_infer.kv import KVPool
from nano_infer.kv.quant import KV_CACHE_DTYPES, dequantize, format_max, kv_bytes_per_token, quantize, storage_dtype
from nano_infer.models.attention import AttentionMetadata, SeqSlice, make_backend
from tests.helpers.checkpoints import GGUF
from tests.helpers.model_factory import TEXT, make_model_dir
from tests.helpers.parity import prompts

QUANTIZED = [d for d in KV_CACHE_DTYPES if d != "auto"]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
# relative precision of each format near its largest value: half a step of int8, 2^-(mantissa bits + 1) for fp8
HALF_STEP = {"int8": 0.5 / 127, "fp8": 2**-4, "fp8_e4m3": 2**-4, "fp8_e5m2": 2**-3}


# -- the quantizer --------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(kv_cache_dtype=st.sampled_from(QUANTIZED), rows=st.integers(1, 5), head_dim=st.sampled_from([1, 4, 64]),
       log_scale=st.floats(-6, 4), seed=st.integers(0, 2**16), zero_row=st.booleans())
def test_each_value_comes_back_within_half_a_step_of_its_vectors_scale(kv_cache_dtype, rows, head_dim, log_scale,
                                                                       seed, zero_row):
    x = torch.randn(rows, 2, head_dim, generator=torch.Generator().manual_seed(seed)) * 10**log_scale
    if zero_row:
        x[0] = 0
    values, scales = quantize(x, kv_cache_dtype)
    assert values.dtype == storage_dtype(kv_cache_dtype) and scales.dtype == torch.float16 and scales.shape == x.shape[:-1]
    back = dequantize(values, scales, torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    # int8: half a step of amax / 127; fp8: relative rounding of each value, or half the smallest step below it
    bound = amax * HALF_STEP[kv_cache_dtype] * 1.01 + scales.float().unsqueeze(-1) * (1 if kv_cache_dtype == "int8" else 2**-6)
    assert ((back - x).abs() <= bound).all()
    if zero_row:
        assert back[0].eq(0).all()  # a zero vector round-trips (its scale is kept above 0)


def test_the_largest_magnitude_of_a_vector_maps_to_the_formats_largest_value():
    x = torch.tensor([[3.0, -12.0, 0.5, 6.0]])
    for d, top in (("int8", 127), ("fp8_e4m3", 448), ("fp8_e5m2", 57344)):
        values, scales = quantize(x, d)
        assert format_max(d) == top and values.float().abs().max() == top
        assert abs(scales.item() - 12.0 / top) <= 12.0 / top * 2**-10  # float16 keeps 11 bits of the scale


def test_bytes_per_token_count_the_scales():
    """SmolLM2-135M: 30 layers x 2 x 3 KV heads; 64 values of 2 bytes (bf16), or 64 of 1 byte + a 2-byte scale."""
    assert kv_bytes_per_token(30, 3, 64, torch.bfloat16) == 30 * 2 * 3 * 128
    assert kv_bytes_per_token(30, 3, 64, torch.bfloat16, "int8") == 30 * 2 * 3 * 66
    assert kv_bytes_per_token(30, 3, 64, torch.float32, "fp8") == 30 * 2 * 3 * 66


# -- the pool and attention through it --------------------------------------------------------------------------
@pytest.mark.parametrize("kv_cache_dtype", QUANTIZED)
@pytest.mark.parametrize("impl", ["gather", "blockwise"])
def test_attention_reads_the_pool_as_rounded_by_hand(kv_cache_dtype, impl):
    """A prompt chunk after 13 cached tokens, in blocks of 4: its output is SDPA over K/V quantized and
    dequantized with the public functions (the oracle here), not over the full-precision K/V."""
    gen = torch.Generator().manual_seed(0)
    kv_heads, groups, dim, cached, new, bs = 2, 3, 16, 13, 6, 4
    k, v = (torch.randn(cached + new, kv_heads, dim, generator=gen) for _ in range(2))
    k[:, :, 5] *= 20  # an outlier channel
    q = torch.randn(new, kv_heads * groups, dim, generator=gen)
    pool = KVPool(1, 8, bs, kv_heads, dim, torch.float32, torch.device("cpu"), kv_cache_dtype)
    table = torch.tensor([5, 2, 7, 0, 3])  # scattered blocks
    slots = (table[:, None] * bs + torch.arange(bs)).flatten()[: cached + new]
    backend = make_backend(impl, pool.store, blocks_per_chunk=2)
    backend.meta = AttentionMetadata(slot_mapping=slots[:cached], prefills=[SeqSlice(0, cached, cached, table[:4])], block_size=bs)
    backend.attend(0, torch.zeros(cached, kv_heads * groups, dim), k[:cached], v[:cached])  # fills the cache
    backend.meta = AttentionMetadata(slot_mapping=slots[cached:], prefills=[SeqSlice(0, new, cached + new, table)], block_size=bs)
    out = backend.attend(0, q, k[cached:], v[cached:])
    kr, vr = (dequantize(*quantize(x, kv_cache_dtype), torch.float32) for x in (k, v))
    visible = torch.arange(cached + new)[None, :] <= torch.arange(cached, cached + new)[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), kr.transpose(0, 1), vr.transpose(0, 1), attn_mask=visible, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=visible, enable_gqa=True).transpose(0, 1)
    assert (out - exact).abs().max() > 1e-4  # the oracle is not the full-precision result: rounding happened


def test_copy_on_write_copies_the_scales_too():
    pool = KVPool(2, 4, 2, 1, 8, torch.float32, torch.device("cpu"), "int8")
    pool.tensor[:, :, 2:4] = 7
    pool.scales[:, :, 2:4] = 0.5
    pool.copy_blocks([(1, 3)])
    assert pool.tensor[:, :, 6:8].eq(7).all() and pool.scales[:, :, 6:8].eq(0.5).all()
    assert pool.nbytes == 2 * 2 * 8 * 1 * (8 + 2)


# -- the engine: capacity, settings ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def head_dim_64_dir(tmp_path_factory, tokenizer):
    """A Llama with SmolLM2's and Qwen2.5-0.5B's head_dim, 64: the scale is 2 bytes beside 64 values."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("head_dim_64")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_the_same_budget_holds_about_twice_the_tokens_of_bfloat16(head_dim_64_dir):
    budget = 4 << 20
    tokens = {}
    for d in ("auto", "int8", "fp8", "fp8_e5m2"):
        llm = LLM(str(head_dim_64_dir), dtype="bfloat16", kv_cache_dtype=d, kv_cache_memory=budget, max_num_seqs=512)
        tokens[d] = bench.pool_tokens(llm)
        assert llm.engine.kv_pool.nbytes <= budget
        assert llm.engine.kv_bytes_per_token == 2 * 2 * (128 if d == "auto" else 66)  # 2 layers, K and V, one head
        stored = "" if d == "auto" else f" in {d}"
        assert f"KV cache{stored} of 4.0 MiB = {tokens[d]:,} tokens" in llm.engine.startup_line
    for d in ("int8", "fp8", "fp8_e5m2"):
        assert tokens[d] >= 1.9 * tokens["auto"], tokens  # 128 / 66 = 1.94


@pytest.mark.parametrize("options, message", [
    (dict(kv_cache="contiguous", kv_cache_dtype="int8"), "needs kv_cache='paged'"),
    (dict(kv_cache="none", kv_cache_dtype="fp8"), "needs kv_cache='paged'"),
    (dict(kv_cache_dtype="int4"), "kv_cache_dtype='int4' is invalid: use one of 'auto', 'int8'"),
])
def test_bad_settings_are_value_errors_that_say_why(options, message):
    with pytest.raises(ValueError, match=message):
        LLM("nowhere", **options)  # refused before the model is looked for


def test_the_command_line_takes_the_flag():
    import argparse

    from nano_infer.cli.engine_args import add_engine_args, engine_kwargs

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_kwargs(p.parse_args(["--kv-cache-dtype", "fp8_e5m2"]))["kv_cache_dtype"] == "fp8_e5m2"
    assert engine_kwargs(p.parse_args([]))["kv_cache_dtype"] == "auto"
    with pytest.raises(SystemExit):
        p.parse_args(["--kv-cache-dtype", "int4"])
