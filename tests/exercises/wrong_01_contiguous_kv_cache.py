"""Planted wrong answers for chapter 01."""
import torch


def kv_bytes_from_config__counts_query_heads(config, bytes_per_element):
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"] * 2 * heads * head_dim * bytes_per_element


def kv_bytes_from_config__ignores_explicit_head_dim(config, bytes_per_element):
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    return config["num_hidden_layers"] * 2 * kv_heads * (config["hidden_size"] // heads) * bytes_per_element


def kv_bytes_from_config__forgets_v(config, bytes_per_element):
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"] * kv_heads * head_dim * bytes_per_element


def decode_attention_gqa__tiles_kv_heads(q, k, v):
    groups = q.shape[0] // k.shape[1]
    keys, values = k.repeat(1, groups, 1), v.repeat(1, groups, 1)  # head h reads KV head h % KVH
    scores = torch.einsum("hd,thd->ht", q, keys) / q.shape[1] ** 0.5
    return torch.einsum("ht,thd->hd", scores.softmax(-1), values)


def decode_attention_gqa__no_scaling(q, k, v):
    groups = q.shape[0] // k.shape[1]
    keys, values = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = torch.einsum("hd,thd->ht", q, keys)
    return torch.einsum("ht,thd->hd", scores.softmax(-1), values)
