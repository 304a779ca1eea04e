"""Chapter 08 exercises: text deltas that never split a UTF-8 character, and stop strings held back while streaming."""
from __future__ import annotations

import codecs

from hypothesis import strategies as st

from .core import call, exercise, expect, forall

_text = st.text(alphabet="ab é中😀\n", min_size=1, max_size=6)


@st.composite
def _pieces(draw):
    """A string's UTF-8 bytes cut at random places, as byte-level BPE tokens cut them."""
    data = draw(_text).encode()
    cuts = sorted(draw(st.sets(st.integers(1, len(data) - 1), max_size=len(data) - 1)) if len(data) > 1 else [])
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@exercise
def utf8_deltas(candidate):
    """Your deltas join to the decoded text, hold no broken character, and release each character as soon as its last byte arrives."""

    def prop(pieces):
        decoder = codecs.getincrementaldecoder("utf-8")()
        want = [decoder.decode(p) for p in pieces]  # what is complete after each piece, no sooner, no later
        desc = f"token bytes {pieces} (the text {b''.join(pieces).decode()!r})"
        got = call(candidate, list(pieces), case=desc)
        expect(list(got) == want, desc, want, got, why="the text to send after each token:")

    forall(_pieces(), prop, examples=[["中".encode()[:1], "中".encode()[1:], b"a"]])


@st.composite
def _stop_cases(draw):
    stops = draw(st.lists(st.text(alphabet="ab", min_size=1, max_size=3), min_size=1, max_size=2, unique=True))
    deltas = draw(st.lists(st.text(alphabet="abc", max_size=3), min_size=1, max_size=6))
    return deltas, stops


def _sendable(text: str, stops: list[str], final: bool) -> str:
    """The part of `text` that may go out: up to the first stop string; else all but a tail that could start one."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    if cut >= 0:
        return text[:cut]
    if final:
        return text
    hold = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[: len(text) - hold]


@exercise
def stop_holdback(candidate):
    """Your stream never sends a stop string or anything after it, and holds back only what could still become one."""

    def prop(case):
        deltas, stops = case
        want, text, sent = [], "", ""
        for d in deltas:
            text += d
            now = _sendable(text, stops, final=False)
            want.append(now[len(sent):])
            sent = now
        want.append(_sendable(text, stops, final=True)[len(sent):])
        desc = f"deltas={deltas}, stop={stops}"
        got = call(candidate, list(deltas), list(stops), case=desc)
        expect(list(got) == want, desc, want, got,
               why="the text to send after each delta (and a last entry for the end of the stream):")

    forall(_stop_cases(), prop, max_examples=50,
           examples=[(["ab", "c", "a", "b"], ["ca"]), (["xa", "a"], ["ab"]), (["a"], ["ab"])])
