"""Planted wrong answers for chapter 14."""


def _quantize(block, per, qmax=127, rounding=round, clip=True):
    tokens, channels = len(block), len(block[0])
    if per == "token":
        scales = [max(abs(x) for x in row) / qmax for row in block]
    else:
        scales = [max(abs(block[t][c]) for t in range(tokens)) / qmax for c in range(channels)]
    pick = (lambda t, c: scales[t]) if per == "token" else (lambda t, c: scales[c])
    q = []
    for t in range(tokens):
        row = []
        for c in range(channels):
            s = pick(t, c)
            v = rounding(block[t][c] / s) if s else 0
            row.append(max(-127, min(127, v)) if clip else v)
        q.append(row)
    return q, scales


def quantize_kv_block__axis_swapped(block, per):
    return _quantize(block, "channel" if per == "token" else "token")


def quantize_kv_block__truncates(block, per):
    return _quantize(block, per, rounding=int)


def quantize_kv_block__divides_by_128(block, per):
    return _quantize(block, per, qmax=128, clip=False)  # amax / (amax / 128) = 128: past int8's 127


def quantize_kv_block__one_scale_for_the_block(block, per):
    amax = max(abs(x) for row in block for x in row)
    s = amax / 127
    q = [[round(x / s) if s else 0 for x in row] for row in block]
    n = len(block) if per == "token" else len(block[0])
    return q, [s] * n


def quantize_kv_block__scale_from_the_signed_max(block, per):
    tokens, channels = len(block), len(block[0])
    groups = block if per == "token" else [[block[t][c] for t in range(tokens)] for c in range(channels)]
    scales = [max(g) / 127 for g in groups]  # the largest value, not the largest magnitude
    pick = (lambda t, c: scales[t]) if per == "token" else (lambda t, c: scales[c])
    q = [[max(-127, min(127, round(block[t][c] / pick(t, c)))) if pick(t, c) > 0 else 0 for c in range(channels)]
         for t in range(tokens)]
    return q, scales


def dequantize_kv_block__axis_swapped(q, scales, per):
    if per == "channel":
        return [[v * scales[min(t, len(scales) - 1)] for v in row] for t, row in enumerate(q)]
    return [[v * scales[min(c, len(scales) - 1)] for c, v in enumerate(row)] for row in q]


def dequantize_kv_block__divides(q, scales, per):
    if per == "token":
        return [[v / scales[t] for v in row] for t, row in enumerate(q)]
    return [[v / scales[c] for c, v in enumerate(row)] for row in q]


def _chats(card, params, layers, heads, dim, tokens, scale_bytes=2, kv_factor=2, four_bit=True, int8=True):
    vectors = layers * kv_factor * heads
    before = max(0, card - 2 * params) // (vectors * dim * 2 * tokens)
    weights = params / 2 if four_bit else 2 * params
    per_value = (dim + scale_bytes) if int8 else dim * 2
    return int(max(0, card - weights) // (vectors * per_value * tokens)) - before


def chats_gained__forgets_the_scales(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat):
    return _chats(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat, scale_bytes=0)


def chats_gained__forgets_v(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat):
    return _chats(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat, kv_factor=1)


def chats_gained__keeps_float16_weights(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat):
    return _chats(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat, four_bit=False)


def chats_gained__scale_per_value(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat):
    vectors = num_layers * 2 * num_kv_heads
    before = max(0, card_bytes - 2 * num_params) // (vectors * head_dim * 2 * tokens_per_chat)
    after = max(0, card_bytes - num_params / 2) // (vectors * head_dim * 3 * tokens_per_chat)  # 1 + 2 bytes a value
    return int(after) - before


def chats_gained__divides_the_bytes_saved(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat):
    vectors = num_layers * 2 * num_kv_heads
    before = max(0, card_bytes - 2 * num_params) // (vectors * head_dim * 2 * tokens_per_chat)
    freed = 2 * num_params - num_params / 2  # only the bytes the weights freed, in int8 chats
    return int(freed // (vectors * (head_dim + 2) * tokens_per_chat))
