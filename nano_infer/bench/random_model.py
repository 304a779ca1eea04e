"""Random-weight models with real models' shapes, built offline and saved like hub checkpoints.

Speed depends on the shape, not on the weights, so a SmolLM2-135M-, Qwen2.5-0.5B- or 1.5B-shaped
model with random weights benchmarks like the real one, without a download. The vocabulary
is the real model's size too (the embedding and LM head are a large share of a small
model's work); prompts use the ids of a local tokenizer, which are all below it.
"""
from __future__ import annotations

import json
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
SHAPE_KEYS = ["model_type", "tie_word_embeddings", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size"]


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
    if (out / "model.safetensors").exists() and _same_shape(out / "config.json", config):
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


def _same_shape(config_path: Path, config) -> bool:
    saved = json.loads(config_path.read_text())
    return all(saved.get(k) == getattr(config, k) for k in SHAPE_KEYS)
