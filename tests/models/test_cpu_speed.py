"""What the CPU fast paths promise: the same numbers as the plain ops they replace.

- bfloat16 linears on oneDNN-packed weights (`models.packed`): same outputs as F.linear, every
  nn.Linear swapped, a packed copy of the tied embedding for the logits, the same greedy tokens
  as an engine built without packing, the parameter count unchanged.
- glibc keeps a step's freed memory (`cpu_allocator`): a step's 100 MB of activations, freed and asked for
  again, faults no pages in; glibc's own thresholds fault all of them on every step.
- greedy picks by `max`: the same index as argmax, ties included.
"""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from nano_infer import LLM, SamplingParams
from nano_infer.engine.cpu_allocator import keep_freed_memory
from nano_infer.models import packed
from nano_infer.models.packed import PackedLinear, can_pack
from nano_infer.engine.sampling import greedy_tokens

needs_packing = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                   reason="no oneDNN bfloat16 here (a torch build without mkldnn, or a CPU without AVX512 or AMX)")


@needs_packing
@pytest.mark.parametrize("rows", [1, 7, 32, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=gen).bfloat16()
    b = torch.randn(96, generator=gen).bfloat16() if bias else None
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    got = PackedLinear(w, b)(x)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())  # float32 reference
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=0.02)
    x3 = x.view(1, rows, 64)  # leading dimensions pass through, like nn.Linear
    assert torch.equal(PackedLinear(w, b)(x3)[0], got)


@needs_packing
def test_pack_linears_swaps_every_linear_and_gives_tied_logits_their_own_copy(model_dir):
    engine = LLM(str(model_dir), dtype="bfloat16", max_model_len=64, device="cpu").engine
    model = engine.model
    assert not [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 4 * model.config.num_hidden_layers + 1  # qkv, o, gate_up, down per layer; the logits
    if model.tie_word_embeddings:  # the copy is a buffer: the parameter count is the checkpoint's
        assert "weight" in dict(model.lm_head.named_buffers()) and not list(model.lm_head.parameters())
    hidden = torch.randn(3, model.config.hidden_size).bfloat16()
    reference = F.linear(hidden.float(), (model.embed_tokens.weight if model.tie_word_embeddings
                                          else model.lm_head.weight.to_dense()).float())
    torch.testing.assert_close(model.compute_logits(hidden).float(), reference, atol=0.1, rtol=0.02)


@needs_packing
def test_packed_engine_gives_the_unpacked_engines_tokens(model_dir, monkeypatch):
    prompts = [[5, 6, 7], list(range(10, 60)), [3] * 20]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    packed_llm = LLM(str(model_dir), dtype="bfloat16", max_model_len=128, device="cpu")
    monkeypatch.setattr(packed, "can_pack", lambda device, dtype: False)
    plain_llm = LLM(str(model_dir), dtype="bfloat16", max_model_len=128, device="cpu")
    assert isinstance(plain_llm.engine.model.layers[0].mlp.down_proj, nn.Linear)
    count = [sum(p.numel() for p in llm.engine.model.parameters()) for llm in (packed_llm, plain_llm)]
    assert count[0] == count[1]
    got = [[o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=greedy)]
           for llm in (packed_llm, plain_llm)]
    assert got[0] == got[1]


def test_float32_keeps_plain_linears(qwen2_dir):
    model = LLM(str(qwen2_dir), dtype="float32", max_model_len=64, device="cpu").engine.model
    assert isinstance(model.layers[0].self_attn.qkv_proj, nn.Linear) and not hasattr(model, "lm_head")


STEPS = """
import resource, sys, torch
from nano_infer.engine.cpu_allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(8192, 3072).sum()  # 100 MB of activations (above glibc's 32 MiB cap), freed at the step's end
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not keep_freed_memory(), reason="the C library is not glibc: mallopt is not there")
def test_freed_step_memory_is_reused_without_page_faults():
    """Each run is a fresh process, so the heap starts as an engine's does, not as hundreds of tests left it."""
    runs = {how: subprocess.Popen([sys.executable, "-c", STEPS, how], stdout=subprocess.PIPE, text=True)
            for how in ("keep", "glibc's own thresholds")}
    faults = {how: [int(line) for line in run.communicate(timeout=120)[0].split()] for how, run in runs.items()}
    pages = 8192 * 3072 * 4 // 4096
    assert faults["glibc's own thresholds"][2] >= pages  # the control: every step maps and faults its tensor anew
    assert faults["keep"][2] < 200  # the third step reuses the heap the first two grew


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3), min_size=1, max_size=12), min_size=1, max_size=6).filter(
    lambda rows: len({len(r) for r in rows}) == 1))
def test_greedy_tokens_is_argmax_ties_included(rows):
    logits = torch.tensor(rows, dtype=torch.float32)  # a small range of integers: ties everywhere
    assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))
