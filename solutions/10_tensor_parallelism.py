"""Chapter 10, reference solutions: `check.shard_qkv`, `check.vocab_parallel_embedding`, `check.allreduce_bytes_per_token`."""
import torch


def shard_qkv(weight: torch.Tensor, heads: int, kv_heads: int, head_dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Rows of the fused [(heads + 2 kv_heads) * head_dim, hidden] q/k/v weight that `rank` holds:
    its query heads, then the K heads they read, then the same V heads."""
    q, k, v = weight.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
    nq = heads // world_size
    if kv_heads % world_size == 0:  # enough KV heads: split them like the query heads
        nk = kv_heads // world_size
        k0 = rank * nk
    else:  # more ranks than KV heads: each rank keeps the one its query heads read
        nk, k0 = 1, rank // (world_size // kv_heads)
    rows = lambda t, first, n: t[first * head_dim : (first + n) * head_dim]  # noqa: E731
    return torch.cat([rows(q, rank * nq, nq), rows(k, k0, nk), rows(v, k0, nk)])


def vocab_parallel_embedding(input_ids: torch.Tensor, weight_shard: torch.Tensor, rank: int) -> torch.Tensor:
    """This rank's part of the embedding: its rows (ids rank*rows .. rank*rows + rows - 1), zeros for other ids."""
    rows = weight_shard.shape[0]
    local = input_ids - rank * rows
    outside = (local < 0) | (local >= rows)
    return weight_shard[local.masked_fill(outside, 0)].masked_fill(outside[:, None], 0.0)


def allreduce_bytes_per_token(hidden_size: int, num_layers: int, dtype_bytes: int, world_size: int) -> float:
    """Bytes one rank sends per token per forward: two all-reduces per layer plus the embedding's,
    each a ring all-reduce of hidden_size values (every rank sends 2 (p - 1) / p of the message)."""
    message = hidden_size * dtype_bytes
    return (2 * num_layers + 1) * 2 * (world_size - 1) / world_size * message
