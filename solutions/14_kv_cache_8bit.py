"""Chapter 14, reference solutions: `check.quantize_kv_block`, `check.dequantize_kv_block`, `check.chats_gained`."""


def quantize_kv_block(block: list[list[float]], per: str):
    """block: rows are tokens, columns channels. One scale per token (per="token") or per channel ("channel"):
    scale = amax / 127 of its group, q = round(x / scale) in -127..127. A group of zeros stores zeros."""
    tokens, channels = len(block), len(block[0])
    if per == "token":
        scales = [max(abs(x) for x in row) / 127 for row in block]
        scale_of = lambda t, c: scales[t]  # noqa: E731
    else:
        scales = [max(abs(block[t][c]) for t in range(tokens)) / 127 for c in range(channels)]
        scale_of = lambda t, c: scales[c]  # noqa: E731
    q = [[max(-127, min(127, round(block[t][c] / scale_of(t, c)))) if scale_of(t, c) else 0 for c in range(channels)]
         for t in range(tokens)]
    return q, scales


def dequantize_kv_block(q: list[list[int]], scales: list[float], per: str) -> list[list[float]]:
    """Each value times the scale of its token (per="token") or of its channel ("channel")."""
    if per == "token":
        return [[v * scales[t] for v in row] for t, row in enumerate(q)]
    return [[v * scales[c] for c, v in enumerate(row)] for row in q]


def chats_gained(card_bytes: int, num_params: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 tokens_per_chat: int) -> int:
    """Whole chats with 4-bit weights (num_params / 2 bytes) and int8 K/V (a byte a value, a float16 scale per
    token and KV head), less whole chats with float16 weights and K/V."""
    vectors = num_layers * 2 * num_kv_heads  # K and V of every layer and KV head, per token
    before = max(0, card_bytes - 2 * num_params) // (vectors * head_dim * 2 * tokens_per_chat)
    after = max(0, card_bytes - num_params / 2) // (vectors * (head_dim + 2) * tokens_per_chat)
    return int(after) - before
