"""bfloat16 against transformers' bfloat16, on the device the engine picks (the GPU where there is one).

bfloat16 keeps 8 bits of mantissa, and two correct implementations round in different places
(packed or fused kernels, batched attention, the order of a sum), so token-identical is too
strict here; the float32 tests in test_parity.py are the exact oracle. The tolerance is
stated against bfloat16's own error, taken from float32 as the truth: the engine's logits may be
no further from transformers' float32 logits, on average, than transformers' bfloat16 logits are
(its residual stream is float32, so it is nearer), and never more than twice their largest error;
where a greedy continuation leaves transformers' tokens, the two tokens must be a near-tie at
that point.
"""
import torch
from transformers import AutoModelForCausalLM

from nano_infer import LLM, LLMEngine, SamplingParams
from nano_infer.models.attention import AttentionMetadata, SeqSlice, make_backend
from tests.helpers.parity import MAX_NEW, prompts


def hf(model_dir, dtype, device):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device).eval()


def test_bf16_logits_within_bf16_error_of_transformers(model_dir, tokenizer):
    engine = LLMEngine(str(model_dir), dtype="bfloat16", kv_cache="none")
    ids = torch.tensor(prompts(tokenizer)[1], device=engine.device)
    backend = make_backend("dense", None)
    backend.meta = AttentionMetadata(slot_mapping=None, prefills=[SeqSlice(0, len(ids), len(ids))])
    with torch.no_grad():
        ours = engine.model.compute_logits(engine.model(ids, torch.arange(len(ids), device=ids.device), backend)).float()
        theirs = hf(model_dir, torch.bfloat16, engine.device)(ids[None]).logits[0].float()
        exact = hf(model_dir, torch.float32, engine.device)(ids[None]).logits[0]
    bf16_error = (theirs - exact).abs().max()
    assert 0 < bf16_error < 0.05 * exact.abs().max()  # the yardstick is bfloat16 rounding, not a broken model
    assert (ours - exact).abs().mean() <= (theirs - exact).abs().mean()
    assert (ours - exact).abs().max() <= 2 * bf16_error


def test_bf16_greedy_leaves_transformers_only_at_near_ties(model_dir, tokenizer):
    llm = LLM(str(model_dir), dtype="bfloat16")
    ps = prompts(tokenizer)
    outs = llm.generate(prompt_token_ids=ps, sampling_params=SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))
    device = llm.engine.device
    ref_model, exact_model = hf(model_dir, torch.bfloat16, device), hf(model_dir, torch.float32, device)
    agreed = 0
    for p, out in zip(ps, outs):
        with torch.no_grad():
            ref = ref_model.generate(torch.tensor([p], device=device), max_new_tokens=MAX_NEW, do_sample=False,
                                     eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        ours = out.outputs[0].token_ids
        k = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ref))
        agreed += k
        if k == len(ref):
            continue
        context = torch.tensor([p + ref[:k]], device=device)
        with torch.no_grad():
            logits = ref_model(context).logits[0, -1].float()
            bf16_error = (logits - exact_model(context).logits[0, -1]).abs().max()
        # transformers' choice over ours, in its own logits (recomputed without its cache: either sign is a tie)
        margin = logits[ref[k]] - logits[ours[k]]
        assert abs(margin) <= 2 * bf16_error, f"prompt {ps.index(p)} leaves at token {k} with margin {margin:.4f}"
    assert agreed >= 0.5 * len(ps) * MAX_NEW  # most tokens agree: the tie check above is not carrying the test
