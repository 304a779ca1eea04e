"""Chapter 00 exercises: top-k / top-p filtering, and the naive decode loop that stops at EOS."""
from __future__ import annotations

import math

import torch
from hypothesis import assume
from hypothesis import strategies as st

from .core import call, exercise, expect, forall


def _kept_reference(logits: list[float], top_k: int, top_p: float) -> tuple[set[int], float]:
    """Brute force in float64: the ids kept, and how close the nucleus came to a tie with top_p."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    if top_k > 0:
        order = order[:top_k]
    top = logits[order[0]]
    weights = [math.exp(logits[i] - top) for i in order]
    total = sum(weights)
    kept, before, margin = set(), 0.0, math.inf
    for i, w in zip(order, weights):
        margin = min(margin, abs(before - top_p))
        if before < top_p or not kept:
            kept.add(i)
        before += w / total
    return kept, margin


_filter_cases = st.tuples(
    st.lists(st.integers(-12, 12), min_size=1, max_size=10, unique=True),
    st.integers(-1, 11),
    st.integers(1, 20).map(lambda n: n / 20),
)


@exercise
def top_k_top_p_filter(candidate):
    """Your filter keeps exactly the tokens the engine's sampler may draw, for any top_k and top_p."""

    def prop(case):
        ints, top_k, top_p = case
        values = [v / 2 for v in ints]
        expected, margin = _kept_reference(values, top_k, top_p)
        assume(margin > 1e-4)  # no float32 rounding decides these cases
        logits = torch.tensor(values)
        desc = f"logits={values}, top_k={top_k}, top_p={top_p}"
        out = call(candidate, logits.clone(), top_k, top_p, case=desc)
        expect(isinstance(out, torch.Tensor) and out.shape == logits.shape, desc,
               why=f"return a tensor shaped like the logits {tuple(logits.shape)}, got {type(out).__name__}"
                   + (f" of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else ""))
        kept = set(torch.isfinite(out).nonzero().view(-1).tolist())
        expect(kept == expected, desc, sorted(expected), sorted(kept), why="token ids left finite:")
        expect(bool((out[sorted(kept)] == logits[sorted(kept)]).all()), desc, why="the kept logits must keep their values")
        expect(bool((out[[i for i in range(len(values)) if i not in kept]] == -math.inf).all()), desc,
               why="dropped logits must be -inf (so softmax gives them probability 0)")

    # top-k cuts the list, then the nucleus must be taken on the renormalised rest
    forall(_filter_cases, prop, examples=[([2, 1, 0], 2, 0.55)])


def _toy_model(vocab: int):
    """A stand-in for forward + argmax: the next token is a fixed function of the whole sequence."""
    seen: list[list[int]] = []

    def next_token(token_ids):
        ids = list(token_ids)
        seen.append(ids)
        return (sum((i + 1) * t for i, t in enumerate(ids)) * 7 + len(ids)) % vocab

    return next_token, seen


_decode_cases = st.tuples(
    st.lists(st.integers(0, 5), min_size=1, max_size=6),
    st.integers(0, 8),
    st.integers(0, 5),
)


@exercise
def generate_until_eos(candidate):
    """Your loop feeds the whole sequence each step, stops after max_new_tokens or right after EOS (kept)."""

    def prop(case):
        prompt, max_new, eos = case
        expected, ids = [], list(prompt)
        next_token, _ = _toy_model(6)
        for _ in range(max_new):
            t = next_token(ids)
            ids.append(t)
            expected.append(t)
            if t == eos:
                break
        next_token, seen = _toy_model(6)
        desc = f"prompt_ids={prompt}, max_new_tokens={max_new}, eos_token_id={eos}"
        got = call(candidate, next_token, list(prompt), max_new, eos, case=desc)
        expect(list(got) == expected, desc, expected, got, why="the generated token ids:")
        wanted_inputs = [list(prompt) + expected[:i] for i in range(len(expected))]
        expect(seen == wanted_inputs, desc, wanted_inputs, seen,
               why="each step must pass the prompt plus every token generated so far:")

    forall(_decode_cases, prop)
