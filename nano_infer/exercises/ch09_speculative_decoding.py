"""Chapter 09 exercises: n-gram prompt lookup, greedy verification, the residual distribution."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from ..spec import accept_greedy as _accept_greedy
from ..spec import propose_ngram
from .core import call, exercise, expect, forall

_tokens = st.lists(st.integers(0, 3), min_size=1, max_size=16)


@exercise
def ngram_propose(candidate):
    """Your lookup proposes what followed the most recent earlier match of the longest tail that recurs."""

    def prop(case):
        tokens, k, lo, span = case
        hi = lo + span
        want = propose_ngram(tokens, k, hi, lo)
        desc = f"token_ids={tokens}, k={k}, lookup_max={hi}, lookup_min={lo}"
        got = call(candidate, list(tokens), k, hi, lo, case=desc)
        expect(list(got) == want, desc, want, got, why="proposed tokens:")

    # the tail [1, 2] occurs twice before: the later occurrence wins; the 3-token tail [0, 1, 2] recurs once
    forall(st.tuples(_tokens, st.integers(1, 4), st.integers(1, 2), st.integers(0, 2)), prop,
           examples=[([1, 2, 3, 1, 2, 0, 0, 1, 2], 2, 1, 1), ([0, 1, 2, 3, 0, 1, 2], 3, 1, 2)])


@exercise
def accept_greedy(candidate):
    """Your verification keeps the proposals up to the first mismatch, then adds the target's own token."""

    def prop(case):
        proposal, argmax = case
        argmax = (argmax + [0] * (len(proposal) + 1))[: len(proposal) + 1]
        want = _accept_greedy(argmax, proposal)
        desc = f"proposal={proposal}, target argmax after each prefix={argmax}"
        got = call(candidate, list(argmax), list(proposal), case=desc)
        expect(list(got) == want, desc, want, got, why="tokens appended:")

    forall(st.tuples(st.lists(st.integers(0, 2), max_size=4), st.lists(st.integers(0, 2), max_size=5)), prop,
           examples=[([1, 2, 0], [1, 2, 0, 2]), ([1, 2], [0, 2, 1])])


@st.composite
def _dists(draw):
    n = draw(st.integers(2, 5))
    w = lambda: [draw(st.integers(0, 8)) for _ in range(n)]  # noqa: E731
    p, q = w(), w()
    p[draw(st.integers(0, n - 1))] += 1  # never all zero
    q[draw(st.integers(0, n - 1))] += 1
    return [x / sum(p) for x in p], [x / sum(q) for x in q]


@exercise
def residual_distribution(candidate):
    """Your residual is max(0, p - q), normalised: what a rejected position is redrawn from."""

    def prop(case):
        p, q = case
        if all(a <= b for a, b in zip(p, q)):  # p == q: nothing is ever rejected, no residual to draw
            return
        r = torch.tensor(p).sub(torch.tensor(q)).clamp(min=0)
        want = (r / r.sum()).tolist()
        desc = f"p={[round(x, 3) for x in p]}, q={[round(x, 3) for x in q]}"
        got = call(candidate, list(p), list(q), case=desc)
        ok = len(got) == len(want) and all(abs(float(a) - b) < 1e-6 for a, b in zip(got, want))
        expect(ok, desc, [round(x, 4) for x in want], got, why="residual distribution:")

    forall(_dists(), prop, examples=[([0.5, 0.5, 0.0], [0.25, 0.25, 0.5])])
