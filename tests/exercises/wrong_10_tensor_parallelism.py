"""Planted wrong answers for chapter 10."""
import torch


def shard_qkv__cuts_the_fused_weight_into_equal_pieces(weight, heads, kv_heads, head_dim, rank, world_size):
    return weight.chunk(world_size)[rank]  # rank 0 gets only q heads, the last rank only k and v


def shard_qkv__splits_kv_heads_even_when_too_few(weight, heads, kv_heads, head_dim, rank, world_size):
    q, k, v = weight.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
    nq, nk = heads // world_size, max(kv_heads // world_size, 1)
    k0 = (rank * nk) % kv_heads  # wraps around instead of picking the head this rank's queries read
    return torch.cat([q[rank * nq * head_dim : (rank + 1) * nq * head_dim],
                      k[k0 * head_dim : (k0 + nk) * head_dim], v[k0 * head_dim : (k0 + nk) * head_dim]])


def vocab_parallel_embedding__clamps_instead_of_masking(input_ids, weight_shard, rank):
    rows = weight_shard.shape[0]
    return weight_shard[(input_ids - rank * rows).clamp(0, rows - 1)]  # other ranks' ids hit an edge row


def vocab_parallel_embedding__forgets_the_offset(input_ids, weight_shard, rank):
    rows = weight_shard.shape[0]
    outside = input_ids >= rows
    return weight_shard[input_ids.masked_fill(outside, 0)].masked_fill(outside[:, None], 0.0)


def allreduce_bytes_per_token__one_sum_per_layer(hidden_size, num_layers, dtype_bytes, world_size):
    return (num_layers + 1) * 2 * (world_size - 1) / world_size * hidden_size * dtype_bytes


def allreduce_bytes_per_token__whole_message_to_every_peer(hidden_size, num_layers, dtype_bytes, world_size):
    return (2 * num_layers + 1) * (world_size - 1) * hidden_size * dtype_bytes
