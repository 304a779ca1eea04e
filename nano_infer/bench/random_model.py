"""Random-weight models with real models' shapes, built offline and saved like hub checkpoints.

Speed depends on the shape, not on the weights, so a SmolLM2-135M-, Qwen2.5-0.5B- or 1.5B-shaped
model with random weights benchmarks like the real one, without a download. The vocabulary
is the real model's size too (the embedding and LM head are a large share of a small
model's work); prompts use the ids of a local tokenizer, which are all below it.

The Mixture-of-Experts shapes keep what makes a real one sparse, its number of experts, the top 8 a token
takes and its norms, and halve the widths and cut the layers, so both engines hold the weights in a few GB:
- OLMOE_1B_7B: OLMoE-1B-7B's 64 experts, top 8 not renormalised, q/k norm over all heads, vocabulary 50,304;
  hidden 1,024 and experts 512 wide (half of 2,048 and 1,024), 8 heads of 128 and as many KV heads (OLMoE
  shares none), 4 layers of 16.
- QWEN3_30B_A3B: Qwen3-30B-A3B's 128 experts, top 8 renormalised, q/k norm per head, vocabulary 151,936;
  hidden 1,024 and experts 384 wide (half of 2,048 and 768), 16 query heads of 128 and 2 KV heads (half
  of 32 and 4), 4 layers of 48, every one sparse.
Random router weights spread the tokens over the experts about evenly, where a trained router has favourites.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

SMOLLM2_135M = dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                    rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
QWEN2_5_0_5B = dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                    num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
                    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN2_5_1_5B = dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                    num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768,
                    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
OLMOE_1B_7B = dict(model_type="olmoe", hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=8, intermediate_size=512, num_experts=64, num_experts_per_tok=8,
                   norm_topk_prob=False, vocab_size=50304, max_position_embeddings=4096, rope_theta=10000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=False)
QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                     num_key_value_heads=2, head_dim=128, intermediate_size=3072, moe_intermediate_size=384,
                     num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[], vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                     rms_norm_eps=1e-6, tie_word_embeddings=False)
SHAPE_KEYS = ["model_type", "tie_word_embeddings", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "head_dim", "num_experts", "num_experts_per_tok",
              "moe_intermediate_size", "norm_topk_prob"]


def random_model(tokenizer_dir: str | Path, shape: dict, name: str, out_dir: str | Path | None = None,
                 seed: int = 0) -> Path:
    """Build (once; later calls reuse the folder) a checkpoint of `shape` ("model_type" plus config fields;
    vocab_size defaults to the tokenizer's) with the tokenizer of `tokenizer_dir`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    dims = {"vocab_size": len(tokenizer), **shape}
    if dims["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size={dims['vocab_size']} is smaller than the tokenizer's {len(tokenizer)} tokens")
    config = AutoConfig.for_model(**dims, eos_token_id=tokenizer.eos_token_id)
    out = Path(out_dir or Path(tempfile.gettempdir()) / "nano_infer_bench" / name)
    if (out / "model.safetensors").exists() and _same_shape(out, config):
        return out
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty() gives the LM head its own tensor; tie it back to the embedding
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _same_shape(folder: Path, config) -> bool:
    """Whether the checkpoint in `folder` has `config`'s shape, read back through its config class (which
    saves some fields under other names: a Qwen3-MoE's num_experts as num_local_experts)."""
    from transformers import AutoConfig

    saved = AutoConfig.from_pretrained(folder)
    return all(getattr(saved, k, None) == getattr(config, k, None) for k in SHAPE_KEYS)
