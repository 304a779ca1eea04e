"""A random Qwen3-MoE checkpoint written as a llama.cpp GGUF file (architecture `qwen3moe`), with its tokenizer.

llama.cpp's qwen3moe has experts in every layer, so the checkpoint here is `make_moe_dir`'s shape with no dense
layer, drawn the same way. The tensors are named as llama.cpp's converter names them, spelled out here rather than
taken from gguf's name table, so that the loader's use of that table is checked against an independent list. The
experts are stored stacked, one tensor per layer for each of gate, up and down, each expert's matrix in the same
orientation as transformers' per-expert `nn.Linear` weight.
"""
import json
from pathlib import Path

import numpy as np
import torch

from .model_factory import MODEL_CLASSES, hf_config

ARCH = "qwen3moe"
# transformers' name (after "model.") -> llama.cpp's, per layer and for the whole model
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp"}
MODEL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}


def make_sparse_qwen3_moe(folder: Path, tokenizer, seed: int = 1, std: float = 0.2):
    """(folder, model): `make_moe_dir("qwen3_moe")`'s config and weights' draw, every layer sparse; saved as a
    hub checkpoint and returned in float32."""
    config = hf_config("qwen3_moe", len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_end|>"))
    config.mlp_only_layers = []
    torch.manual_seed(seed)
    model = MODEL_CLASSES["qwen3_moe"](config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0.0, std)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model


def gguf_tensors_of(model) -> dict[str, np.ndarray]:
    """llama.cpp's name -> float32 array in torch's order of dimensions, for every weight of a Qwen3-MoE model."""
    out = {}
    for name, w in model.state_dict().items():
        w = w.float().numpy()
        if name in MODEL_NAMES:
            out[MODEL_NAMES[name]] = w
            continue
        layer, rest = name.removeprefix("model.layers.").split(".", 1)
        if rest == "mlp.experts.gate_up_proj":  # [E, 2 * inter, hidden]: gate rows, then up rows
            gate, up = np.split(w, 2, axis=1)
            out[f"blk.{layer}.ffn_gate_exps.weight"], out[f"blk.{layer}.ffn_up_exps.weight"] = gate, up
        elif rest == "mlp.experts.down_proj":  # [E, hidden, inter]
            out[f"blk.{layer}.ffn_down_exps.weight"] = w
        else:
            module, suffix = rest.rsplit(".", 1)
            out[f"blk.{layer}.{LAYER_NAMES[module]}.{suffix}"] = w
    return out


Q8_0_EXPERTS_AND_QKV = {"_exps.": "Q8_0", "attn_q.": "Q8_0", "attn_k.": "Q8_0", "attn_v.": "Q8_0"}


def write_qwen3moe_gguf(path: Path, model, tokenizer, types: dict[str, str] = Q8_0_EXPERTS_AND_QKV) -> Path:
    """The model and tokenizer as a GGUF file: a tensor whose name holds a key of `types` quantized to that type
    (one gguf's numpy quantizer makes: Q8_0, Q4_0, Q4_1), the rest F32; the config as llama.cpp's converter writes
    it for Qwen3-MoE; the tokenizer as byte-level BPE ("gpt2")."""
    from gguf import GGMLQuantizationType, GGUFWriter, TokenType
    from gguf.quants import quantize

    c = model.config
    writer = GGUFWriter(str(path), ARCH)
    writer.add_name("nano_infer test qwen3moe")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_expert_feed_forward_length(c.moe_intermediate_size)
    writer.add_expert_count(c.num_experts)
    writer.add_expert_used_count(c.num_experts_per_tok)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    vocab = tokenizer.backend_tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tokenizer.all_special_tokens)
    merges = [m if isinstance(m, str) else " ".join(m)
              for m in json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)
    for name, w in gguf_tensors_of(model).items():
        kind = next((GGMLQuantizationType[t] for part, t in types.items() if part in name), None)
        writer.add_tensor(name, w) if kind is None else writer.add_tensor(name, quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
