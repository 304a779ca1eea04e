"""Chapter 15 exercises: a router's top-k choice with and without renormalisation, and the rows each rank sends
each other rank in an expert-parallel all-to-all."""
from __future__ import annotations

import math

from hypothesis import strategies as st

from .core import call, exercise, expect, forall


def _softmax(row: list[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(x - top) for x in row]
    total = sum(exps)
    return [e / total for e in exps]


@st.composite
def _logits(draw):
    """T tokens of E distinct scores (no ties, so the top k is one set), and k <= E."""
    experts, tokens = draw(st.integers(2, 10)), draw(st.integers(1, 4))
    rows = []
    for _ in range(tokens):  # a shuffled ladder of scores, steep or flat
        step, shift = draw(st.sampled_from([0.05, 0.5, 1.5])), draw(st.sampled_from([-2.0, 0.0, 3.0]))
        rows.append([shift + step * x for x in draw(st.permutations(range(experts)))])
    return rows, draw(st.integers(1, experts)), draw(st.booleans())


def _show(rows):
    return "[" + ", ".join("[" + ", ".join(f"{x:g}" for x in row) + "]" for row in rows) + "]"


@exercise
def top_k_route(candidate):
    """Your router picks each token's k most probable experts, largest first, with the softmax's probabilities,
    renormalised to sum to 1 when asked (the engine's `route`)."""

    def prop(case):
        logits, k, renormalise = case
        desc = f"logits={_show(logits)}, k={k}, renormalise={renormalise}"
        got = call(candidate, [list(row) for row in logits], k, renormalise, case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, "(weights, experts)", got,
               why="return a pair: the weights, then the experts, each a list of one list of k per token")
        weights, experts = [list(map(float, w)) for w in got[0]], [list(map(int, e)) for e in got[1]]
        expect(len(weights) == len(experts) == len(logits), desc, f"{len(logits)} tokens",
               f"{len(weights)} weight lists and {len(experts)} expert lists", why="one list per token:")
        for t, row in enumerate(logits):
            probs = _softmax(row)
            want = sorted(range(len(row)), key=lambda e: -probs[e])[:k]
            expect(experts[t] == want, desc, f"experts[{t}] = {want}", f"experts[{t}] = {experts[t]}",
                   why=f"token {t}'s {k} experts of the largest softmax probability (= the largest logits), "
                       "largest first:")
            chosen = [probs[e] for e in want]
            if renormalise:
                chosen = [p / sum(chosen) for p in chosen]
            expect(len(weights[t]) == k and all(abs(a - b) <= 1e-6 + 1e-5 * b for a, b in zip(weights[t], chosen)),
                   desc, f"weights[{t}] = {[round(p, 6) for p in chosen]}",
                   f"weights[{t}] = {[round(p, 6) for p in weights[t]]}",
                   why=("the softmax over all the token's experts, then the k chosen probabilities divided by their "
                        "sum:") if renormalise else
                   "the softmax over all the token's experts, the k chosen probabilities as they are (no "
                   "renormalisation: they sum to less than 1):")

    forall(_logits(), prop, max_examples=40,
           examples=[([[2.0, 1.0, 0.5, -1.0]], 2, True), ([[2.0, 1.0, 0.5, -1.0]], 2, False),
                     ([[0.1, 0.3, 0.2]], 3, False), ([[-1.0, 5.0, 0.0, 4.0], [1.0, 0.0, 2.0, 3.0]], 1, True)])


@st.composite
def _dispatch(draw):
    world, per_rank = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    experts_total, tokens = world * per_rank, draw(st.integers(1, 10))
    k = draw(st.integers(1, experts_total))
    experts = [draw(st.permutations(range(experts_total)))[:k] for _ in range(tokens)]
    token_rank = [draw(st.integers(0, world - 1)) for _ in range(tokens)]
    return experts, token_rank, per_rank, world


def _reference_counts(experts, token_rank, per_rank, world):
    counts = [[0] * world for _ in range(world)]
    for chosen, src in zip(experts, token_rank):
        for e in chosen:
            counts[src][e // per_rank] += 1
    return counts


@exercise
def all_to_all_counts(candidate):
    """Your counts are the dispatch's rows between each pair of ranks: one row per token-expert pair, from the
    token's rank (row) to the rank holding the expert (column), the diagonal the rows that stay."""

    def prop(case):
        experts, token_rank, per_rank, world = case
        desc = f"experts={experts}, token_rank={token_rank}, experts_per_rank={per_rank}, world={world}"
        got = call(candidate, [list(e) for e in experts], list(token_rank), per_rank, world, case=desc)
        want = _reference_counts(experts, token_rank, per_rank, world)
        got = [[int(v) for v in row] for row in got]
        owner = {e: e // per_rank for e in range(per_rank * world)}
        expect(got == want, desc, want, got,
               why=f"counts[s][d]: pairs of a token on rank s with an expert on rank d (rank d holds experts "
                   f"{per_rank} * d .. {per_rank} * d + {per_rank - 1}; here the experts' ranks are "
                   f"{[[owner[e] for e in row] for row in experts]}), one row per pair, the diagonal included:")

    forall(_dispatch(), prop, max_examples=40,
           examples=[([[0, 3], [1, 2], [3, 2]], [0, 0, 1], 2, 2), ([[0, 1, 2, 3]], [1], 2, 2),
                     ([[5, 0], [2, 3]], [2, 0], 2, 3)])
