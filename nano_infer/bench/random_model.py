"""A random-weight model with a real model's shape, built offline and saved like a hub checkpoint.

Speed depends on the shape, not on the weights, so a Qwen2.5-0.5B-shaped model with
random weights benchmarks like the real one, without a download. Only the vocabulary is
small (it comes from a local tokenizer), which shrinks the embedding and LM head: the
24 transformer layers, where the time goes, are the real size.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

QWEN2_5_0_5B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    intermediate_size=4864, max_position_embeddings=32768, rope_theta=1000000.0,
                    rms_norm_eps=1e-6, tie_word_embeddings=True)


def random_qwen2_model(tokenizer_dir: str | Path, dims: dict = QWEN2_5_0_5B, name: str = "qwen2.5-0.5b-shape",
                       out_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Build (once; later calls reuse the folder) a Qwen2 checkpoint with `dims` and the tokenizer's vocabulary."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = Path(out_dir or Path(tempfile.gettempdir()) / "nano_infer_bench" / f"{name}-v{len(tokenizer)}")
    config = Qwen2Config(vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, **dims)
    if (out / "model.safetensors").exists() and _same_shape(out / "config.json", config):
        return out
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
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
    keys = ["tie_word_embeddings", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size"]
    return all(saved.get(k) == getattr(config, k) for k in keys)
