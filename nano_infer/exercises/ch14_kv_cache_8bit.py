"""Chapter 14 exercises: a block of K/V quantized to int8 with one scale per token or per channel, read back with
the right scale for each value, and the chats a 24 GB card gains from 4-bit weights and an int8 KV cache."""
from __future__ import annotations

from hypothesis import strategies as st

from .core import call, exercise, expect, forall

QMAX = 127  # int8's largest magnitude: the scale maps a group's amax to it
PER = ("token", "channel")

_value = st.floats(-50, 50, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def _blocks(draw):
    """A block of `tokens` rows by `channels` columns, sometimes with one channel far larger than the rest
    (a K outlier channel), sometimes with an all-zero row or column."""
    tokens, channels = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    block = [[draw(_value) for _ in range(channels)] for _ in range(tokens)]
    kind = draw(st.sampled_from(["plain", "outlier", "zero row", "zero column"]))
    if kind == "outlier":
        c = draw(st.integers(0, channels - 1))
        for row in block:
            row[c] *= 40
    elif kind == "zero row":
        block[draw(st.integers(0, tokens - 1))] = [0.0] * channels
    elif kind == "zero column":
        c = draw(st.integers(0, channels - 1))
        for row in block:
            row[c] = 0.0
    return block, draw(st.sampled_from(PER))


def _groups(block, per):
    """The (row, column) positions of each group that shares a scale: a row per token, a column per channel."""
    tokens, channels = len(block), len(block[0])
    if per == "token":
        return [[(t, c) for c in range(channels)] for t in range(tokens)]
    return [[(t, c) for t in range(tokens)] for c in range(channels)]


def _show(block):
    return "[" + ", ".join("[" + ", ".join(f"{x:.6g}" for x in row) + "]" for row in block) + "]"


# hand-picked: square blocks (a swapped axis still returns the right number of scales), an outlier channel, a zero row
_EXAMPLES = [
    ([[1.0, -2.0, 0.5], [0.1, 0.2, -0.3], [4.0, 0.0, 1.0]], "token"),
    ([[1.0, -2.0, 0.5], [0.1, 0.2, -0.3], [4.0, 0.0, 1.0]], "channel"),
    ([[0.1, 20.0, -0.2, 0.05], [0.3, -25.0, 0.1, -0.1]], "token"),
    ([[0.1, 20.0, -0.2, 0.05], [0.3, -25.0, 0.1, -0.1]], "channel"),
    ([[0.0, 0.0], [1.0, -0.5]], "token"),
    ([[0.3, 0.7, 0.2, 0.5]], "token"),  # one group: rounding 0.2 / (0.7 / 127) = 36.3 down, 0.5 -> 90.7 up
]


@exercise
def quantize_kv_block(candidate):
    """Your int8 values and scales are the engine's rule: scale = amax / 127 per token (or per channel), every value
    rounded to its nearest step, none past +-127."""

    def prop(case):
        block, per = case
        desc = f"block={_show(block)}, per={per!r}"
        got = call(candidate, [list(row) for row in block], per, case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, "(q, scales)", got,
               why="return a pair: q (a list of rows of ints, the block's shape), then the list of scales")
        q, scales = [list(row) for row in got[0]], [float(s) for s in got[1]]
        tokens, channels = len(block), len(block[0])
        expect(len(q) == tokens and all(len(row) == channels for row in q), desc, f"{tokens} rows of {channels} ints",
               f"{len(q)} rows of {[len(row) for row in q]}", why="q has the block's shape, one int8 per value:")
        groups = _groups(block, per)
        expect(len(scales) == len(groups), desc, f"{len(groups)} scales", f"{len(scales)} scales",
               why=f"one scale per {per}: a block of {tokens} tokens by {channels} channels has {len(groups)} of them:")
        for i, (group, s) in enumerate(zip(groups, scales)):
            values = [block[t][c] for t, c in group]
            amax = max(abs(x) for x in values)
            which = f"{per} {i}"
            for t, c in group:
                v = q[t][c]
                expect(v == int(v) and -QMAX <= v <= QMAX, desc, "an integer in -127..127", f"q[{t}][{c}] = {v}",
                       why=f"int8 values run from -127 to 127 (the format's -128 is left unused, so +-amax map to +-127):")
            if amax == 0:
                expect(all(q[t][c] == 0 for t, c in group), desc, f"zeros in {which}",
                       [q[t][c] for t, c in group], why=f"{which} is all zeros: it stores zeros (and must not divide by 0):")
                continue
            want = amax / QMAX
            expect(abs(s - want) <= 1e-3 * want, desc, f"scale of {which} = {want:.6g}", f"{s:.6g}",
                   why=f"the scale maps {which}'s largest magnitude ({amax:.6g}) to 127: amax / 127:")
            for t, c in group:
                x, v = block[t][c], q[t][c]
                near = max(-QMAX, min(QMAX, round(x / s)))
                expect(abs(v * s - x) <= s / 2 + 1e-3 * amax, desc, f"q[{t}][{c}] = {near}", f"q[{t}][{c}] = {v}",
                       why=f"{x:.6g} must go to its nearest step of {s:.6g} (round, do not truncate); yours reads back "
                           f"as {v * s:.6g}, more than half a step away:")

    forall(_blocks(), prop, max_examples=60, examples=_EXAMPLES)


@st.composite
def _quantized(draw):
    tokens, channels = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    per = draw(st.sampled_from(PER))
    q = [[draw(st.integers(-QMAX, QMAX)) for _ in range(channels)] for _ in range(tokens)]
    n = tokens if per == "token" else channels
    scales = [draw(st.floats(2.0**-14, 4.0, width=16)) for _ in range(n)]
    return q, scales, per


@exercise
def dequantize_kv_block(candidate):
    """Your read-back multiplies each int8 value by the scale of its own token (or channel): the block attention sees."""

    def prop(case):
        q, scales, per = case
        desc = f"q={q}, scales={scales}, per={per!r}"
        got = call(candidate, [list(row) for row in q], list(scales), per, case=desc)
        want = [[v * scales[t if per == "token" else c] for c, v in enumerate(row)] for t, row in enumerate(q)]
        got = [[float(x) for x in row] for row in got]
        expect(len(got) == len(want) and all(len(a) == len(b) for a, b in zip(got, want)), desc,
               f"{len(want)} rows of {len(want[0])} floats", f"{len(got)} rows of {[len(row) for row in got]}",
               why="the block comes back in its own shape:")
        for t, (a, b) in enumerate(zip(got, want)):
            for c, (x, y) in enumerate(zip(a, b)):
                expect(abs(x - y) <= 1e-6 * abs(y) + 1e-9, desc, f"x[{t}][{c}] = {y:.6g}", f"x[{t}][{c}] = {x:.6g}",
                       why=f"q[{t}][{c}] = {q[t][c]} times the scale of its {per} "
                           f"({scales[t if per == 'token' else c]:.6g}):")

    forall(_quantized(), prop, max_examples=40,
           examples=[([[1, -2], [3, 4]], [0.5, 0.25], "token"), ([[1, -2], [3, 4]], [0.5, 0.25], "channel"),
                     ([[127, 0, -127]], [0.01], "token")])


def _reference_chats(card_bytes, num_params, num_layers, num_kv_heads, head_dim, tokens_per_chat):
    """(chats with float16 weights and K/V, chats with 4-bit weights and an int8 K/V cache)."""
    vectors = num_layers * 2 * num_kv_heads  # K and V, every layer and KV head, per token
    fp16_chat = vectors * head_dim * 2 * tokens_per_chat
    int8_chat = vectors * (head_dim + 2) * tokens_per_chat  # a byte a value and a float16 scale per vector
    before = max(0, card_bytes - 2 * num_params) // fp16_chat
    after = max(0, 2 * card_bytes - num_params) // (2 * int8_chat)  # weights of num_params / 2 bytes, in halves
    return before, after


@exercise
def chats_gained(candidate):
    """Your count is the chats a card gains when float16 weights and K/V become 4-bit weights and an int8 K/V cache
    (a float16 scale per token and KV head)."""

    def prop(case):
        desc = ("card_bytes={}, num_params={}, num_layers={}, num_kv_heads={}, head_dim={}, tokens_per_chat={}"
                .format(*case))
        before, after = _reference_chats(*case)
        got = call(candidate, *case, case=desc)
        card, params, layers, heads, dim, tokens = case
        vectors = layers * 2 * heads
        why = (f"float16: weights {2 * params:,} bytes, a chat's K/V {vectors * dim * 2 * tokens:,} bytes -> {before:,} "
               f"whole chats; 4-bit weights {params / 2:,.0f} bytes, int8 K/V {vectors * (dim + 2) * tokens:,} bytes a "
               f"chat (K and V, {layers} layers x {heads} KV heads x ({dim} bytes + a 2-byte scale) a token) -> "
               f"{after:,} whole chats:")
        expect(got == after - before, desc, after - before, got, why=why)

    gib = 2**30
    cases = st.tuples(st.integers(1, 96).map(lambda g: g * gib), st.integers(0, 40 * 10**9), st.integers(1, 80),
                      st.integers(1, 16), st.sampled_from([32, 64, 80, 96, 128, 256]), st.integers(1, 32768))
    seven_b = (24 * gib, 7_241_732_096, 32, 8, 128, 4096)  # Mistral-7B's shape on a 24 GiB card
    forall(cases, prop, max_examples=60,
           examples=[seven_b, (24 * gib, 13 * 10**9, 40, 40, 128, 4096), (8 * gib, 7 * 10**9, 32, 8, 128, 2048),
                     (24 * gib, 2 * 10**9, 28, 2, 128, 32768)])
