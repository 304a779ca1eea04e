"""Random-weight checkpoints built from scaled-down real configs, saved in the hub layout.

Weights are drawn with std 0.1 (not the default 0.02): at the default init a random model
repeats a handful of tokens, which makes "token-identical" a weak check.
"""
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, OlmoeConfig,
                          OlmoeForCausalLM, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = """To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer
the slings and arrows of outrageous fortune, or to take arms against a sea of troubles.
{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true, "score": -1.5e3}
The quick brown fox jumps over the lazy dog 0123456789. 你好，世界！ 🙂🚀 café naïve
def f(x): return x * 2  # code
"""


def make_tokenizer(folder: Path, vocab_size: int = 600) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def hf_config(family: str, vocab_size: int, eos_token_id: int):
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, eos_token_id=eos_token_id, bos_token_id=None)
    if family == "qwen2":  # Qwen2.5-0.5B shape, scaled down: qkv bias, tied embeddings
        return Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1000000.0)
    if family == "qwen3":  # Qwen3-0.6B: q/k norm, explicit head_dim
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=True, rope_theta=1000000.0)
    if family == "llama":  # Llama-3.2-1B: llama3 rope scaling, untied here to cover lm_head
        return LlamaConfig(**common, tie_word_embeddings=False, rope_theta=500000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 256})
    if family == "qwen3_moe":  # Qwen3-30B-A3B: 8 of 128 experts renormalised, q/k norm per head; here 8 of 16, a dense layer
        return Qwen3MoeConfig(**{**common, "num_hidden_layers": 3}, head_dim=32, num_experts=16, num_experts_per_tok=8,
                              moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1],
                              tie_word_embeddings=False, rope_theta=1000000.0)
    if family == "olmoe":  # OLMoE-1B-7B: 8 of 64 experts not renormalised, q/k norm over all heads, as many KV heads
        return OlmoeConfig(**{**common, "num_key_value_heads": 4, "intermediate_size": 32}, num_experts=16,
                           num_experts_per_tok=8, norm_topk_prob=False, pad_token_id=None)
    if family == "mixtral":  # Mixtral-8x7B: 8 experts, 2 a token renormalised, 4 query heads a KV head, no sliding window
        return MixtralConfig(**{**common, "intermediate_size": 32}, num_local_experts=8, num_experts_per_tok=2,
                             sliding_window=None, tie_word_embeddings=False, rope_theta=1000000.0)
    raise ValueError(family)


MODEL_CLASSES = {"qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM, "llama": LlamaForCausalLM,
                 "qwen3_moe": Qwen3MoeForCausalLM, "olmoe": OlmoeForCausalLM, "mixtral": MixtralForCausalLM}
MOE_FAMILIES = ("qwen3_moe", "olmoe", "mixtral")


def make_model_dir(family: str, folder: Path, tokenizer, seed: int = 0, std: float = 0.1) -> Path:
    config = hf_config(family, len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    model = MODEL_CLASSES[family](config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_moe_dir(family: str, folder: Path, tokenizer) -> Path:
    """A random Mixture-of-Experts checkpoint (qwen3_moe or olmoe). A token's output sums eight experts, each
    weighted about 1/8: at std 0.1 that averaging leaves the greedy text repeating a token or two, at 0.2 it
    varies as a dense model's does at 0.1."""
    assert family in MOE_FAMILIES, family
    return make_model_dir(family, folder, tokenizer, seed=1, std=0.2)


def hf_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()


def make_padded_vocab_dir(folder: Path, tokenizer, vocab_size: int = 152_064, **config) -> Path:
    """A qwen2 test model with `vocab_size` rows (Qwen2.5's by default) of which the tokenizer's are real and the rest
    zero, as a checkpoint's padding rows: a logit row costs what it costs on the real model. `config` overrides the
    shape (hidden_size, num_hidden_layers, max_position_embeddings, ...)."""
    small = hf_config("qwen2", vocab_size, tokenizer.convert_tokens_to_ids("<|im_end|>")).to_dict()
    del small["layer_types"]  # one per layer: made again for the layers asked
    torch.manual_seed(0)
    model = MODEL_CLASSES["qwen2"](Qwen2Config(**{**small, **config}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0.0, 0.1)
        model.model.embed_tokens.weight[len(tokenizer):] = 0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

