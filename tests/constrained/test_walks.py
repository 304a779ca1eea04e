"""Property tests: any walk that only takes allowed tokens spells a match when it ends."""
from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from nano_infer import SamplingParams
from nano_infer.constrained import build_constraint
from tests.helpers.byte_bpe import byte_bpe_vocabulary
from tests.helpers.walks import REGEXES, chooser, walk


@settings(max_examples=60, deadline=None)
@given(pattern=st.sampled_from(REGEXES), data=st.data())
def test_random_walks_fullmatch_their_regex(pattern, data):
    vocab = byte_bpe_vocabulary()
    constraint = build_constraint(SamplingParams(regex=pattern), vocab, "cpu")
    text = walk(constraint, vocab, chooser(data)).decode("utf-8")  # strict: whole characters only
    assert re.fullmatch(pattern, text), text


@settings(max_examples=20, deadline=None)
@given(pattern=st.sampled_from([r'"[^"\\]{0,12}"', r"[一-龥]{1,4}(市|省)?", r"(🙂|😀|é)+!"]), data=st.data())
def test_walks_through_multibyte_tokens_stay_valid_utf8(pattern, data):
    vocab = byte_bpe_vocabulary()
    constraint = build_constraint(SamplingParams(regex=pattern), vocab, "cpu")
    text = walk(constraint, vocab, chooser(data), prefer_non_ascii=True).decode("utf-8")
    assert re.fullmatch(pattern, text), text


def test_forked_walks_do_not_disturb_each_other():
    vocab = byte_bpe_vocabulary()
    parent = build_constraint(SamplingParams(regex=REGEXES[3]), vocab, "cpu")
    state = parent.state
    texts = {walk(parent.fork(), vocab, lambda n, k=k: (k * 7919) % n) for k in range(5)}
    assert parent.state == state and len(texts) > 1
