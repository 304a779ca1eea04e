"""How far from the hardware's matmul speed: FLOPs per generated token vs. a large matmul.

Decoding a token runs every weight matrix once on one row (2 FLOPs per weight: a
multiply and an add) plus attention over the context (q.k and p.v: 2 x 2 FLOPs per
head dimension per key). Multiply by tokens/s and divide by what one large square
matmul achieves on the same machine, measured in the same run, and you get the fraction
of the roofline the engine reaches. Small batches and Python overhead keep it well
below 1; a perfectly batched decode of a big model approaches it.

The same count over a whole benchmark workload (`workload_flops`: every prompt token's
prefill as well as every decode) gives the least time any engine could take on this
machine, hence a ceiling on tokens/s, and on how many times faster than another engine
anything could be: ceiling / that engine's tokens/s.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch


def matmul_gflops(n: int | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  repeats: int = 5, clock: Callable[[], float] = time.perf_counter) -> float:
    """Best of `repeats` timings of an n x n @ n x n matmul, in GFLOP/s (`clock` as in `decode.copy_bandwidth`)."""
    device = torch.device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = clock()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, clock() - start)
    return 2 * n**3 / best / 1e9


def matmul_params(config) -> int:
    """Weights that take part in a matmul for every token: attention and MLP projections, and the LM head."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * config.intermediate_size
    return layers * per_layer + hidden * config.vocab_size


def flops_per_token(config, context_len: float) -> float:
    """Forward FLOPs for one decoded token that attends over `context_len` keys."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * context_len
    return 2 * matmul_params(config) + attention


def workload_flops(config, requests) -> float:
    """All the forward FLOPs a workload needs, prefill included: the least work any engine must do.

    A request with a p-token prompt and m outputs runs p + m - 1 tokens through the layers
    (the last output is never fed back); the token at position i attends over i + 1 keys.
    The LM head runs m times: once for the prompt's last token, then once per decode.
    `requests` are (prompt length, output length) pairs. Prefix sharing would lower it; bench
    prompts are random, so none of them share one.
    """
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    head = config.hidden_size * config.vocab_size
    body = 2 * (matmul_params(config) - head)
    per_key = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim
    total = 0.0
    for p, m in requests:
        n = p + m - 1  # tokens through the layers, at positions 0 .. n-1
        total += n * body + per_key * n * (n + 1) / 2 + m * 2 * head
    return total


def decode_throughput(engine, num_seqs: int, context: int, steps: int = 5) -> dict:
    """Steady-state decode: `num_seqs` sequences at ~`context` tokens, all decoding; tokens/s over `steps` steps
    (wall and CPU time). The requests are aborted afterwards, leaving the engine empty."""
    from .profile import decoding

    with decoding(engine, num_seqs, context, seed=1):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            engine.step()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"num_seqs": num_seqs, "context": context + steps // 2, "tokens_per_s": num_seqs * steps / wall,
            "tokens_per_cpu_s": num_seqs * steps / cpu}
