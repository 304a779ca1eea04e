"""Chapter 07 exercises: the tokens a DFA state allows, and a regex for a list of choices."""
from __future__ import annotations

import functools

from hypothesis import strategies as st

from ..constrained.byte_dfa import ByteDFA
from .core import Mismatch, call, exercise, expect, forall

PATTERNS = [r"[0-9]{1,3}", r"(yes|no|maybe)", r'"[a-z]*"', r"a+b?c", r'\{"x": [0-9]+\}', r"(ab)*é"]
ALPHABET = [b"0", b"1", b"9", b"y", b"e", b"s", b"n", b"o", b"a", b"b", b"c", b'"', b"{", b"}", b"x", b":", b" ",
            "é".encode()[:1], "é".encode()[1:]]


@functools.lru_cache(maxsize=None)
def _dfa(pattern: str) -> ByteDFA:
    return ByteDFA.from_regex(pattern)


_token = st.one_of(st.none(), st.lists(st.sampled_from(ALPHABET), max_size=3).map(b"".join))


@st.composite
def _allowed_cases(draw):
    pattern = draw(st.sampled_from(PATTERNS))
    state = draw(st.integers(0, _dfa(pattern).num_states - 1))
    return pattern, state, draw(st.lists(_token, min_size=1, max_size=12))


@exercise
def allowed_tokens(candidate):
    """Your set is exactly the tokens whose bytes the DFA reads from that state without rejecting (never an empty token)."""

    def prop(case):
        pattern, state, vocab = case
        dfa = _dfa(pattern)
        want = sorted(i for i, data in enumerate(vocab) if data and dfa.walk(data, state) >= 0)
        desc = f"the DFA of {pattern!r}, state {state}, token_bytes={vocab}"
        got = call(candidate, dfa, state, list(vocab), case=desc)
        expect(sorted(got) == want, desc, want, sorted(got), why="allowed token ids:")

    forall(_allowed_cases(), prop, max_examples=50,
           examples=[(r"(yes|no|maybe)", 0, [b"y", b"yes", b"yx", b"", None, b"no", b"n", b"x"])])


def _probes(choices: list[str]) -> set[str]:
    """Strings near the choices: a regex that is almost right matches some of them."""
    out = {""}
    for c in choices:
        out.update(c[:i] for i in range(len(c)))
        out.update(c[:i] + c[i + 1:] for i in range(len(c)))  # one character dropped
        out.update(c[:i] + c[i] + c[i:] for i in range(len(c)))  # one character doubled
        out.update(c[:i] + "z" + c[i + 1:] for i in range(len(c)))  # one character replaced
        out.update(c + d for d in choices)
    return out - set(choices)


_choices = st.lists(st.text(alphabet="ab.|*+?()[]{}\\^$é ", min_size=1, max_size=4), min_size=1, max_size=3, unique=True)


@exercise
def choice_regex(candidate):
    """Your regex matches each choice in full and nothing else, whatever characters the choices contain."""

    def prop(choices):
        desc = f"choices={choices}"
        pattern = call(candidate, list(choices), case=desc)
        try:
            dfa = ByteDFA.from_regex(pattern)
        except (ValueError, TypeError) as e:
            raise Mismatch(desc, why=f"your regex {pattern!r} does not compile: {e}") from None
        for c in choices:
            expect(dfa.fullmatch(c.encode()), desc, why=f"your regex {pattern!r} does not match the choice {c!r}")
        for s in sorted(_probes(choices)):
            expect(not dfa.fullmatch(s.encode()), desc,
                   why=f"your regex {pattern!r} also matches {s!r}, which is not one of the choices")

    forall(_choices, prop, examples=[["a.b", "(x)"], ["yes", "no"]])
