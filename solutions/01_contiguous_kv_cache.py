"""Chapter 01, reference solutions: `check.kv_bytes_from_config`, `check.decode_attention_gqa`."""
import torch


def kv_bytes_from_config(config: dict, bytes_per_element: int) -> int:
    """KV cache bytes one token costs, from a Hugging Face config dict.

    K and V, in every layer, for every KV head (num_key_value_heads, or every attention head if
    the config has none), head_dim wide (the config's head_dim if set, else hidden_size / heads).
    """
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"] * 2 * kv_heads * head_dim * bytes_per_element


def decode_attention_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One new token's attention over the cache. q [H, D], k and v [T, KVH, D] -> [H, D].

    Query head h reads KV head h // (H // KVH): consecutive query heads share a KV head.
    """
    heads, dim = q.shape
    kv_heads = k.shape[1]
    qg = q.view(kv_heads, heads // kv_heads, dim)  # [KVH, G, D]: the heads sharing each KV head
    scores = torch.einsum("kgd,tkd->kgt", qg, k) / dim**0.5
    out = torch.einsum("kgt,tkd->kgd", scores.softmax(-1), v)
    return out.reshape(heads, dim)
