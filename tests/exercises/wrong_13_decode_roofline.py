"""Planted wrong answers for chapter 13."""
import struct


def quantize_q4_1__sixteen_steps(weights):
    lo, hi = min(weights), max(weights)
    d = (hi - lo) / 16
    return d, lo, [min(15, round((w - lo) / d)) if d else 0 for w in weights]


def quantize_q4_1__truncates(weights):
    lo, hi = min(weights), max(weights)
    d = (hi - lo) / 15
    return d, lo, [min(15, int((w - lo) / d)) if d else 0 for w in weights]


def quantize_q4_1__symmetric_like_q4_0(weights):
    amax = max(abs(w) for w in weights)
    d = amax / 7.5
    return d, -8 * d, [min(15, max(0, round(w / d + 8))) if d else 8 for w in weights]


def quantize_q4_1__divides_by_a_zero_range(weights):
    lo, hi = min(weights), max(weights)
    d = (hi - lo) / 15
    return d, lo, [round((w - lo) / d) for w in weights]


def pack_q4_1__adjacent_nibbles(d, m, q):
    return struct.pack("<ee", d, m) + bytes(q[2 * j] | (q[2 * j + 1] << 4) for j in range(16))


def pack_q4_1__high_nibble_first(d, m, q):
    return struct.pack("<ee", d, m) + bytes((q[j] << 4) | q[j + 16] for j in range(16))


def pack_q4_1__float32_scales(d, m, q):
    return struct.pack("<ff", d, m) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


def pack_q4_1__m_before_d(d, m, q):
    return struct.pack("<ee", m, d) + bytes(q[j] | (q[j + 16] << 4) for j in range(16))


def q8_halves__no_offset(q):
    return q >> 4, q & 15


def q8_halves__halves_swapped(q):
    u = q + 128
    return u & 15, u >> 4


def q8_halves__offset_of_127(q):
    u = q + 127
    return u >> 4, u & 15


def sequences_that_fit__rounds_up(card_bytes, weight_bytes, kv_bytes_per_token, tokens_per_sequence):
    return -(-max(0, card_bytes - weight_bytes) // (kv_bytes_per_token * tokens_per_sequence))


def sequences_that_fit__negative_when_weights_exceed(card_bytes, weight_bytes, kv_bytes_per_token, tokens_per_sequence):
    return (card_bytes - weight_bytes) // (kv_bytes_per_token * tokens_per_sequence)


def sequences_that_fit__counts_tokens(card_bytes, weight_bytes, kv_bytes_per_token, tokens_per_sequence):
    return max(0, card_bytes - weight_bytes) // kv_bytes_per_token


def graph_bucket__rounds_down(batch_size, buckets):
    fits = [b for b in buckets if b <= batch_size]
    return fits[-1] if fits else buckets[0]


def graph_bucket__largest_past_the_end(batch_size, buckets):
    return next((b for b in buckets if b >= batch_size), buckets[-1])


def graph_bucket__strictly_larger(batch_size, buckets):
    return next((b for b in buckets if b > batch_size), None)
