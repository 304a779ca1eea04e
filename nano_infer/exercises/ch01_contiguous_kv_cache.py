"""Chapter 01 exercises: KV bytes per token from a model config, one decode step of GQA attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from ..kv.paged import kv_bytes_per_token
from .core import call, exercise, expect, forall

# Real configs (the fields that matter), each a trap for one mistake.
REAL_CONFIGS = {
    "Qwen2.5-1.5B, bf16": ({"num_hidden_layers": 28, "hidden_size": 1536, "num_attention_heads": 12,
                            "num_key_value_heads": 2}, 2),
    "Llama-3-70B, bf16": ({"num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                           "num_key_value_heads": 8}, 2),
    "Qwen3-0.6B (head_dim is not hidden/heads), bf16": (
        {"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 128}, 2),
    "GPT-2-style, no num_key_value_heads (every head has its own K/V), fp32": (
        {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12}, 4),
}


def _reference(config: dict, bytes_per_element: int) -> int:
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    dtype = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[bytes_per_element]
    return kv_bytes_per_token(config["num_hidden_layers"], kv_heads, head_dim, dtype)


@st.composite
def _configs(draw):
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4, 7]))
    head_dim = draw(st.sampled_from([32, 64, 80, 128]))
    config = {"num_hidden_layers": draw(st.integers(1, 96)), "num_attention_heads": heads,
              "hidden_size": heads * head_dim}
    if draw(st.booleans()) or kv_heads != heads:
        config["num_key_value_heads"] = kv_heads
    if draw(st.booleans()):
        config["head_dim"] = draw(st.sampled_from([64, 128, 256]))
    return config, draw(st.sampled_from([1, 2, 4]))


@exercise
def kv_bytes_from_config(candidate):
    """Your formula gives the KV bytes per token of any config: GQA, an explicit head_dim, or neither."""

    def prop(case):
        config, nbytes = case
        desc = f"config={config}, bytes_per_element={nbytes}"
        got = call(candidate, dict(config), nbytes, case=desc)
        expect(got == _reference(config, nbytes), desc, _reference(config, nbytes), got, why="KV bytes per token:")

    for name, (config, nbytes) in REAL_CONFIGS.items():
        got = call(candidate, dict(config), nbytes, case=name)
        expect(got == _reference(config, nbytes), f"{name}: {config}", _reference(config, nbytes), got,
               why="KV bytes per token:")
    forall(_configs(), prop)


def _decode_reference(q, k, v):
    groups = q.shape[0] // k.shape[1]
    keys, values = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # [T, H, D]
    return F.scaled_dot_product_attention(q[:, None, :], keys.transpose(0, 1), values.transpose(0, 1))[:, 0, :]


_gqa_cases = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 9), st.sampled_from([4, 8, 16]),
                       st.integers(0, 2**16))


@exercise
def decode_attention_gqa(candidate):
    """Your decode step matches SDPA over K/V repeated per query head, for any grouping of heads."""

    def prop(case):
        kv_heads, groups, length, dim, seed = case
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(kv_heads * groups, dim, generator=g)
        k, v = torch.randn(2, length, kv_heads, dim, generator=g)
        desc = (f"{kv_heads * groups} query heads sharing {kv_heads} KV heads, {length} cached tokens, "
                f"head_dim {dim} (random q, k, v with torch seed {seed})")
        got = call(candidate, q.clone(), k.clone(), v.clone(), case=desc)
        want = _decode_reference(q, k, v)
        expect(isinstance(got, torch.Tensor) and got.shape == want.shape, desc, tuple(want.shape),
               tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__, why="output shape:")
        err = (got.float() - want).abs().max().item()
        worst = int((got.float() - want).abs().amax(-1).argmax())
        expect(err < 1e-4, desc, want[worst].tolist(), got[worst].tolist(),
               why=f"query head {worst} differs by up to {err:.3g}:")

    forall(_gqa_cases, prop)
