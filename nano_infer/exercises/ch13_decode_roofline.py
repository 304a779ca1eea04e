"""Chapter 13 exercises: a Q4_1 block quantized and packed by hand, a Q8_0 byte split into two int4 halves,
the sequences a card's memory holds, the captured batch size a decode step pads to."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from ..engine.cuda_graph import BATCH_BUCKETS, batch_bucket
from ..models.quant_formats import GROUP, Int4Weight, unpack_q4_1
from .core import call, exercise, expect, forall

_groups = st.lists(st.floats(-4, 4, allow_nan=False, allow_infinity=False, width=32), min_size=GROUP, max_size=GROUP)


@exercise
def quantize_q4_1(candidate):
    """Your quantization finds Q4_1's scale and minimum, and rounds every weight to its nearest of the 16 levels."""

    def prop(weights):
        ref = Int4Weight.quantize(torch.tensor([weights], dtype=torch.float32))  # the engine's rule, one group
        want_d, want_m = ref.d.item(), ref.m.item()
        desc = f"weights={weights}"
        got = call(candidate, list(weights), case=desc)
        expect(isinstance(got, tuple) and len(got) == 3, desc, "(d, m, q)", got,
               why="return a triple: the scale d, the minimum m, then the 32 integers q")
        d, m, q = float(got[0]), float(got[1]), [int(v) for v in got[2]]
        expect(abs(d - want_d) <= 1e-5 * abs(want_d) + 1e-7, desc, want_d, d,
               why="d spreads the group's range (max - min) over the 15 steps between 16 levels:")
        expect(abs(m - want_m) <= 1e-6, desc, want_m, m, why="m is the group's smallest weight (level 0):")
        expect(len(q) == GROUP and all(0 <= v <= 15 for v in q), desc, "32 integers in 0..15", q,
               why="q holds one 4-bit level per weight:")
        for i, (w, v) in enumerate(zip(weights, q)):
            err = abs(d * v + m - w)
            expect(err <= d / 2 + 1e-5 * (abs(w) + d) + 1e-7, desc, f"q[{i}] = {round((w - m) / d) if d else 0}", f"q[{i}] = {v}",
                   why=f"weight {i} ({w:.6g}) must go to its nearest level d*q + m; yours is {err:.3g} away, "
                       f"more than half a step ({d / 2:.3g}):")

    # a group of one value (no range: d = 0), and one whose weights fall near the middle of their steps
    forall(_groups, prop, max_examples=60,
           examples=[[0.5] * GROUP, [i / 31 for i in range(GROUP)], [-1.0] + [0.0] * 30 + [1.0]])


_blocks = st.tuples(st.floats(2.0**-10, 2.0, width=16), st.floats(-2.0, 2.0, width=16),
                    st.lists(st.integers(0, 15), min_size=GROUP, max_size=GROUP))


@exercise
def pack_q4_1(candidate):
    """Your 20 bytes are a Q4_1 block as llama.cpp stores it: the engine's unpacker reads back your d, m and q."""

    def prop(block):
        d, m, q = block
        desc = f"d={d!r}, m={m!r}, q={q}"
        got = call(candidate, d, m, list(q), case=desc)
        expect(isinstance(got, (bytes, bytearray)) and len(got) == 20, desc, "20 bytes",
               f"{type(got).__name__} of length {len(got)}" if hasattr(got, "__len__") else got,
               why="a Q4_1 block is 2 bytes of d (float16), 2 of m (float16), 16 of nibbles:")
        w = unpack_q4_1(np.frombuffer(bytearray(got), dtype=np.uint8).reshape(1, 20))
        back = (w.d.item(), w.m.item(), w.q[0].tolist())
        expect(back[0] == d and back[1] == m, desc, (d, m), back[:2], why="d and m as the unpacker reads them:")
        expect(back[2] == list(q), desc, list(q), back[2],
               why="q as the unpacker reads it (byte j holds q[j] in its low nibble and q[j + 16] in its high one):")

    forall(_blocks, prop, max_examples=40, examples=[(0.5, -1.0, list(range(16)) * 2), (1.0, 0.25, [15] * 16 + [0] * 16)])


@exercise
def q8_halves(candidate):
    """Your two 4-bit values rebuild every int8: q = 16 * (hi - 8) + lo, both halves in 0..15 (what `Q8Linear`
    multiplies: hi with scale 16d and zero 0, lo with scale d and zero 8d)."""
    for q in range(-128, 128):
        desc = f"q={q}"
        got = call(candidate, q, case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, "(hi, lo)", got, why="return a pair: hi, then lo")
        hi, lo = got
        want = ((q + 128) >> 4, (q + 128) & 15)
        expect(all(isinstance(v, int) and 0 <= v <= 15 for v in got), desc, want, got,
               why="the int4 kernel takes values 0..15 (it subtracts 8 itself): shift q by 128 first, into 0..255:")
        expect(16 * (hi - 8) + lo == q, desc, want, got,
               why=f"16 * (hi - 8) + lo must give q back; yours gives {16 * (hi - 8) + lo}:")


@exercise
def sequences_that_fit(candidate):
    """Your count is how many whole sequences of KV fit in the memory the weights leave on the card."""

    def prop(case):
        card, weights, per_token, tokens = case
        want = max(0, card - weights) // (per_token * tokens)
        desc = f"card_bytes={card}, weight_bytes={weights}, kv_bytes_per_token={per_token}, tokens_per_sequence={tokens}"
        got = call(candidate, card, weights, per_token, tokens, case=desc)
        left = card - weights
        why = (f"the weights leave {left:,} bytes; a sequence needs {per_token * tokens:,} bytes of K/V; only whole "
               "sequences count" if left >= 0 else "the weights alone exceed the card: no sequence fits")
        expect(got == want, desc, want, got, why=why + ":")

    gib = 2**30
    cases = st.tuples(st.integers(1, 64).map(lambda g: g * gib), st.integers(0, 48 * gib),
                      st.integers(1, 1 << 20), st.integers(1, 32768))
    forall(cases, prop, max_examples=60,
           examples=[(24 * gib, 25 * gib, 1024, 100), (24 * gib, 8 * gib, 2**19, 4096), (1024, 0, 1, 1000)])


@exercise
def graph_bucket(candidate):
    """Your batch size pads up to the smallest captured size that holds it, and runs eager past the largest."""

    def prop(case):
        batch, buckets = case
        want = batch_bucket(batch) if tuple(buckets) == BATCH_BUCKETS else next((b for b in buckets if b >= batch), None)
        desc = f"batch_size={batch}, buckets={buckets}"
        got = call(candidate, batch, list(buckets), case=desc)
        why = ("no captured graph is large enough: the step runs eager (None)" if want is None else
               "the smallest captured size at least as large as the batch (a smaller one would drop sequences, a "
               "larger one computes more padding):")
        expect(got == want, desc, want, got, why=why)

    cases = st.tuples(st.integers(1, 600), st.lists(st.integers(1, 512), min_size=1, max_size=8, unique=True).map(sorted))
    # a bucket between sizes, one exactly full, one past the largest; the engine's own buckets (where the
    # expected answer is its `batch_bucket`'s)
    forall(cases, prop, max_examples=60, examples=[(3, [1, 2, 4, 8]), (8, [1, 2, 4, 8]), (9, [1, 2, 4, 8]), (1, [1]),
                                                    (20, list(BATCH_BUCKETS)), (513, list(BATCH_BUCKETS))])
