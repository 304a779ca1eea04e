"""Constrained walks: `walk()` picks allowed tokens by the caller's choices for a while, then heads for
the nearest accepting state so that every walk finishes (a uniform random walk inside a JSON string
would rarely pick the closing quote). REGEXES are the patterns the property tests draw from."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

REGEXES = [
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    r"(yes|no|maybe)",
    r"(ab|abcd)x?",
    r'"([^"\\]|\\.)*"',
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    r"[一-龥]{1,4}(市|省)?",
    r"(🙂|😀|é)+!",
    r"[^a-z]{2,5}",
    r".{0,6}x",
    r"(name|age): [a-z ]{0,10}\n",
    r"^(yes|no)!?$",
]


def steps_to_accept(index) -> np.ndarray:
    """Fewest tokens from each state to an accepting state (Bellman-Ford over token edges)."""
    counts = np.diff(index.offsets)
    start = np.repeat(np.arange(index.num_states), counts)
    dist = np.where(index.accepting, 0, np.iinfo(np.int64).max // 2)
    while True:
        through = np.full_like(dist, np.iinfo(np.int64).max // 2)
        np.minimum.at(through, start, dist[index.next_states] + 1)
        new = np.minimum(dist, through)
        if (new == dist).all():
            return dist
        dist = new


def walk(constraint, vocab, choose, free_steps: int = 30, prefer_non_ascii: bool = False) -> bytes:
    """Walk to EOS; `choose(n)` picks one of n options during the first `free_steps` steps."""
    dist = steps_to_accept(constraint.index)
    (eos,) = vocab.eos_token_ids
    out = []
    for step in range(free_steps + 200):
        if constraint.is_done:
            break
        options = list(constraint.index.allowed(constraint.state))
        if step >= free_steps:  # head for the end
            if constraint.is_accepting:
                break
            token = min(options, key=lambda t: dist[constraint.index.next_state(constraint.state, t)])
        else:
            if prefer_non_ascii:
                wide = [t for t in options if max(vocab.token_bytes[t]) >= 0x80]
                options = wide or options
            if constraint.is_accepting:
                options.append(eos)
            token = options[choose(len(options))]
            if token == eos:
                constraint.advance(eos)
                break
        constraint.advance(token)
        out.append(vocab.token_bytes[token])
    assert constraint.is_accepting
    return b"".join(out)


def chooser(data):
    return lambda n: data.draw(st.integers(0, n - 1))
