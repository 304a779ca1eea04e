"""A token index keeps a bounded number of mask rows, and counts the most it can hold."""
from __future__ import annotations

import torch

from nano_infer import SamplingParams
from nano_infer.constrained import token_index as token_index_module
from nano_infer.constrained.constraint import compile_index, constraint_key
from tests.helpers.byte_bpe import byte_bpe_vocabulary


def test_mask_rows_are_bounded_and_rebuilt_alike(monkeypatch):
    vocab = byte_bpe_vocabulary()
    index = compile_index(constraint_key(SamplingParams(regex="[a-z]{0,40}")), vocab)
    monkeypatch.setattr(token_index_module, "MASK_ROW_BYTES", 8 * 4 * vocab.vocab_size)
    cpu = torch.device("cpu")
    first = {s: index.mask_row(s, cpu).clone() for s in range(index.num_states)}
    assert index.num_states > 8 and len(index.mask_rows) == index.rows_kept == 8
    for s in range(index.num_states):  # rows dropped are built again, the same
        assert torch.equal(index.mask_row(s, cpu), first[s])
    arrays = sum(a.nbytes for a in (index.accepting, index.live, index.offsets, index.tokens, index.next_states,
                                    index.transitions))
    assert index.max_bytes == arrays + 8 * 4 * vocab.vocab_size


def test_next_state_reads_the_dfa_without_a_copy():
    vocab = byte_bpe_vocabulary()
    index = compile_index(constraint_key(SamplingParams(regex="(ab|cd)e")), vocab)
    ab = next(i for i, b in enumerate(vocab.token_bytes) if b == b"a")
    state = index.next_state(index.initial, ab)
    assert state >= 0 and isinstance(state, int) and index._transition_rows.obj is index.transitions
