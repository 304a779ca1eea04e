"""Prompt lookup: propose the tokens that followed the last occurrence of the sequence's own tail.

When an output quotes its input (editing, summarising, code with repeated names), the last
few tokens have usually appeared before, and what followed them then is a good guess for what
follows now. No model runs: the guess costs a search over the sequence's token ids.
"""
from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], k: int, lookup_max: int, lookup_min: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of the last n tokens,
    trying n = lookup_max down to lookup_min; [] when no tail of that length recurs."""
    tokens = np.asarray(token_ids)
    for n in range(min(lookup_max, len(tokens) - 1), lookup_min - 1, -1):
        tail = tokens[-n:]
        # windows starting at 0 .. len-n-1: every earlier n-gram (not the tail itself)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if len(hits):
            start = hits[-1] + n
            return tokens[start : start + k].tolist()
    return []
