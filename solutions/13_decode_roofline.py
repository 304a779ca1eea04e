"""Chapter 13, reference solutions: `check.quantize_q4_1`, `check.pack_q4_1`, `check.q8_halves`,
`check.sequences_that_fit`, `check.graph_bucket`."""
import struct


def quantize_q4_1(weights: list[float]):
    """32 floats -> (d, m, q): w is about d * q + m, q in 0..15 (llama.cpp's Q4_1 block)."""
    lo, hi = min(weights), max(weights)
    d = (hi - lo) / 15  # 16 levels, 15 steps between them
    q = [min(15, max(0, round((w - lo) / d))) if d else 0 for w in weights]
    return d, lo, q


def pack_q4_1(d: float, m: float, q: list[int]) -> bytes:
    """d and m as float16, then 16 bytes: byte j holds q[j] in its low nibble and q[j + 16] in its high one."""
    return struct.pack("<ee", d, m) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


def q8_halves(q: int) -> tuple[int, int]:
    """An int8 (-128..127) as two values in 0..15 with q = 16 * (hi - 8) + lo: q + 128 is one unsigned byte."""
    u = q + 128
    return u >> 4, u & 15


def sequences_that_fit(card_bytes: int, weight_bytes: int, kv_bytes_per_token: int, tokens_per_sequence: int) -> int:
    """Whole sequences of K/V in what the weights leave (none when the weights alone do not fit)."""
    return max(0, card_bytes - weight_bytes) // (kv_bytes_per_token * tokens_per_sequence)


def graph_bucket(batch_size: int, buckets: list[int]):
    """The smallest captured batch size >= batch_size (buckets ascending), or None: run the step eager."""
    for size in buckets:
        if size >= batch_size:
            return size
    return None
