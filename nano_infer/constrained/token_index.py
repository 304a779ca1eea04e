"""Per DFA state: which tokens may come next, and the state each one leads to.

Built once per (regex, vocabulary) by walking the vocabulary trie alongside the DFA from every
state at once, one trie level per step: a (start state, trie node, DFA state) triple survives a
level while the DFA accepts the node's byte, and every surviving node that spells a token
records "from start state, this token leads to this state". At decode time the mask is then a
lookup of a precomputed row, never a walk over the vocabulary.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from .byte_dfa import ByteDFA, reaches
from .vocabulary import TokenVocabulary

# Bytes of mask rows one index keeps (all devices together), least recently used dropped first: n samples of a
# many-state constraint each visit states of their own, and a row is 4 bytes per vocabulary entry.
MASK_ROW_BYTES = 32 << 20


@dataclass(eq=False)
class TokenIndex:
    initial: int
    accepting: np.ndarray  # [num_states] bool: EOS allowed
    live: np.ndarray  # [num_states] bool: some token sequence still reaches an accepting state
    offsets: np.ndarray  # [num_states + 1]: state s owns tokens[offsets[s]:offsets[s + 1]]
    tokens: np.ndarray  # int32, grouped by state
    next_states: np.ndarray  # int32, aligned with tokens
    transitions: np.ndarray  # [num_states, 256] int32: the byte DFA
    token_bytes: list[bytes | None] | None  # the vocabulary's own list (None while sent between processes)
    eos_token_ids: tuple[int, ...]
    # Mask rows of recently visited states, by (state, device), at most `rows_kept`. A full table
    # would cost states x vocabulary x 4 bytes (hundreds of MB at a 151k vocabulary, for one
    # schema), while a generation visits few states.
    mask_rows: OrderedDict = field(default_factory=OrderedDict, repr=False)

    @property
    def num_states(self) -> int:
        return len(self.accepting)

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def allowed(self, state: int) -> np.ndarray:
        """Text tokens allowed in `state` (EOS not included)."""
        return self.tokens[self.offsets[state]:self.offsets[state + 1]]

    def next_state(self, state: int, token_id: int) -> int:
        """The state after `token_id`, or -1 if the token is not allowed. EOS keeps the state.

        Reads the token's few bytes through the DFA rather than searching the state's token
        list, which can hold most of the vocabulary.
        """
        if token_id in self.eos_token_ids:
            return state if self.accepting[state] else -1
        data = self.token_bytes[token_id] if 0 <= token_id < self.vocab_size else None
        if not data:
            return -1
        rows = self._transition_rows
        for byte in data:
            state = rows[state, byte]
            if state < 0:
                return -1
        return state if self.live[state] else -1

    @cached_property
    def _transition_rows(self) -> memoryview:
        """The byte DFA read as `rows[state, byte]` -> int, with no copy: nested lists read a little
        faster but hold a Python int object per entry, several times the array's own bytes."""
        return memoryview(self.transitions)

    @property
    def rows_kept(self) -> int:
        return max(1, MASK_ROW_BYTES // (4 * self.vocab_size))

    @property
    def max_bytes(self) -> int:
        """The most this index can hold: its arrays and all the mask rows it may keep (what a cache counts)."""
        arrays = (self.accepting, self.live, self.offsets, self.tokens, self.next_states, self.transitions)
        return sum(a.nbytes for a in arrays) + min(self.num_states, self.rows_kept) * 4 * self.vocab_size

    def mask_row(self, state: int, device: torch.device) -> torch.Tensor:
        """[vocab_size] float32 on `device`: 0 for allowed tokens, -inf for the rest."""
        key = (state, device)
        row = self.mask_rows.get(key)
        if row is not None:
            self.mask_rows.move_to_end(key)
            return row
        row = torch.full((self.vocab_size,), float("-inf"))
        row[torch.from_numpy(self.allowed(state))] = 0.0
        if self.accepting[state]:
            row[list(self.eos_token_ids)] = 0.0
        row = self.mask_rows[key] = row.to(device)
        if len(self.mask_rows) > self.rows_kept:
            self.mask_rows.popitem(last=False)
        return row

    @classmethod
    def build(cls, dfa: ByteDFA, vocab: TokenVocabulary) -> "TokenIndex":
        start, token, nxt = _walk(dfa, vocab.trie)
        # Keep only transitions into states from which EOS stays reachable by whole tokens:
        # a state the DFA can finish from might still need bytes no token sequence spells.
        live = reaches(start, nxt, dfa.accepting)
        if not live[dfa.initial]:
            raise ValueError("no sequence of tokens from this vocabulary can complete a match")
        keep = live[nxt] & live[start]
        start, token, nxt = start[keep], token[keep], nxt[keep]
        # Group by start state; a stable sort on 16-bit keys is a linear-time radix sort.
        order = np.argsort(start.astype(np.uint16 if dfa.num_states <= 1 << 16 else np.int64), kind="stable")
        offsets = np.searchsorted(start[order], np.arange(dfa.num_states + 1))
        return cls(dfa.initial, dfa.accepting, live, offsets, token[order].astype(np.int32),
                   nxt[order].astype(np.int32), dfa.transitions, vocab.token_bytes,
                   tuple(sorted(vocab.eos_token_ids)))


def _walk(dfa: ByteDFA, trie) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (start state, token id, end state) with the token's bytes readable from start."""
    table = dfa.transitions.reshape(-1)
    has_token = np.diff(trie.token_start) > 0
    # The frontier: one entry per (start state, trie node) still alive, with its DFA state.
    start = np.arange(dfa.num_states, dtype=np.int32)
    node = np.zeros(dfa.num_states, dtype=np.int64)
    state = start.copy()
    found = []
    while len(start):
        parent, child = _expand(trie.child_start[node], trie.child_count[node])
        child_state = table[state[parent] * 256 + trie.edge_byte[child]]
        ok = child_state >= 0
        start, node, state = start[parent[ok]], child[ok], child_state[ok]
        ends = has_token[node]
        found.append((start[ends], node[ends], state[ends]))
    start, node, state = (np.concatenate(parts) for parts in zip(*found))
    # A node may spell several token ids (same bytes): one entry per id.
    which, at = _expand(trie.token_start[node], np.diff(trie.token_start)[node])
    return start[which], trie.token_ids[at], state[which]


def _expand(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ranges [starts[i], starts[i] + counts[i]) laid end to end, with each element's i."""
    which = np.repeat(np.arange(len(counts)), counts)
    first = np.cumsum(counts) - counts
    return which, starts[which] + np.arange(len(which)) - first[which]
