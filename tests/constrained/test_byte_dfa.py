"""Byte DFA: accepts exactly the UTF-8 encodings of the strings Python's re.fullmatch accepts."""
from __future__ import annotations

import functools
import re

import pytest
from hypothesis import given, settings, strategies as st

from nano_infer.constrained import ByteDFA
from tests.helpers.walks import REGEXES

# Characters the regexes talk about, plus any character at all (every UTF-8 length).
TEXT = st.text(st.sampled_from(list("ab0129-.xyeéE+市省中文🙂😀! \n\"\\")) | st.characters(exclude_categories=["Cs"]), max_size=12)

dfa_of = functools.lru_cache(maxsize=None)(ByteDFA.from_regex)


@settings(max_examples=300, deadline=None)
@given(pattern=st.sampled_from(REGEXES), text=TEXT)
def test_fullmatch_agrees_with_python_re(pattern, text):
    assert dfa_of(pattern).fullmatch(text.encode()) == bool(re.fullmatch(pattern, text, flags=re.ASCII))


@pytest.mark.parametrize("data", [
    b"\xc0\x80",  # overlong NUL
    b"\xe0\x80\x80",  # overlong, 3 bytes
    b"\xed\xa0\x80",  # a surrogate, U+D800
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\xff", b"\x80", b"\xe4\xb8",  # not a lead byte; lone continuation; cut short
])
def test_invalid_utf8_is_never_accepted(data):
    assert not ByteDFA.from_regex(r"[\s\S]*").fullmatch(data)


def test_boundaries_of_each_utf8_length_are_accepted():
    dfa = ByteDFA.from_regex(r"[\s\S]")
    for cp in (0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF):
        assert dfa.fullmatch(chr(cp).encode()), hex(cp)


def test_minimised_and_pruned():
    # (a|b)* then c: two states once equivalent ones merge, however the regex is written.
    assert ByteDFA.from_regex(r"(a|b)*c").num_states == ByteDFA.from_regex(r"(a*b*)*(c|c)").num_states == 2
    # No state is left from which an accepting state cannot be reached.
    dfa = ByteDFA.from_regex(r"ab|a[^\s\S]")
    assert dfa.num_states == 3


def test_anchors_are_implied():
    assert ByteDFA.from_regex(r"^ab$").num_states == ByteDFA.from_regex("ab").num_states
    assert ByteDFA.from_regex(r"a\$").fullmatch(b"a$")


@pytest.mark.parametrize("pattern,matches,rejects", [
    (r"[\u4e00-\u9fff]{2,5}", ["李雷", "你好世界"], ["ab", "李", "李雷ab"]),
    (r"a\u002eb", ["a.b"], ["axb"]),  # an escaped metacharacter stays literal
    (r"\u{1F600}+|\U0001F642", ["😀😀", "🙂"], ["😀🙂"]),
    (r"a\\u0041", ["a\\u0041"], ["aA"]),  # an escaped backslash: the text \u0041 itself
])
def test_unicode_escapes_are_characters(pattern, matches, rejects):
    dfa = ByteDFA.from_regex(pattern)
    for text in matches:
        assert dfa.fullmatch(text.encode()) and re.fullmatch(pattern.replace(r"\u{1F600}", "\U0001F600"), text)
    for text in rejects:
        assert not dfa.fullmatch(text.encode())


def test_a_lone_surrogate_escape_is_refused():
    with pytest.raises(ValueError, match="surrogate"):
        ByteDFA.from_regex(r"a\ud800")
