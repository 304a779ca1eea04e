"""The vocabulary's byte strings as a trie, laid out for walking one level at a time with numpy.

Tokens share prefixes ("\"n", "\"na", "\"name" ...), so walking a trie alongside the DFA reads
each shared prefix once instead of once per token. Nodes are numbered breadth first and, within
a level, in sorted order, which makes the children of every node a contiguous range: one level
of a walk, for any number of (node, DFA state) pairs at once, is a handful of array operations.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class VocabTrie:
    edge_byte: np.ndarray  # [num_nodes] uint8: the byte on the edge into the node (root: 0)
    child_start: np.ndarray  # [num_nodes] int64: first child; children are contiguous
    child_count: np.ndarray  # [num_nodes] int64
    token_start: np.ndarray  # [num_nodes + 1] int64: tokens spelled by node n are
    token_ids: np.ndarray  # token_ids[token_start[n]:token_start[n + 1]] (usually 0 or 1)

    @property
    def num_nodes(self) -> int:
        return len(self.edge_byte)

    @classmethod
    def build(cls, token_bytes: dict[int, bytes]) -> "VocabTrie":
        """Trie of the non-empty byte strings in `token_bytes` (token id -> bytes)."""
        pairs = sorted((b, i) for i, b in token_bytes.items() if b)
        strings = [b for b, _ in pairs]
        ids = np.array([i for _, i in pairs], dtype=np.int64)
        n = len(strings)
        lengths = np.array([len(s) for s in strings], dtype=np.int64)
        width = int(lengths.max()) if n else 0
        padded = np.frombuffer(b"".join(s.ljust(width, b"\0") for s in strings), dtype=np.uint8)
        padded = padded.reshape(n, width)

        # Longest common prefix with the previous string in sorted order: string i opens a
        # new node at depth d exactly when it differs from string i-1 within the first d bytes
        # (a string equal to the previous one, another id for the same bytes, opens none).
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            differ = padded[1:] != padded[:-1]
            first_diff = np.where(differ.any(axis=1), differ.argmax(axis=1), width)
            lcp[1:] = np.minimum(first_diff, np.minimum(lengths[1:], lengths[:-1]))

        edge_byte, parent = [np.zeros(1, np.uint8)], [np.zeros(1, np.int64)]
        node_of = np.zeros(n, dtype=np.int64)  # each string's node at the current depth
        end_node = np.zeros(n, dtype=np.int64)
        num_nodes = 1
        for depth in range(1, width + 1):
            alive = np.flatnonzero(lengths >= depth)
            opens = lcp[alive] < depth
            new_nodes = num_nodes + np.cumsum(opens) - 1
            parent.append(node_of[alive][opens])
            edge_byte.append(padded[alive[opens], depth - 1])
            node_of[alive] = new_nodes
            ends = lengths[alive] == depth
            end_node[alive[ends]] = new_nodes[ends]
            num_nodes += int(opens.sum())

        parent = np.concatenate(parent)
        child_count = np.bincount(parent[1:], minlength=num_nodes).astype(np.int64)
        child_start = np.zeros(num_nodes, dtype=np.int64)
        child_start[parent[1:][::-1]] = np.arange(num_nodes - 1, 0, -1)  # first child wins
        token_start = np.concatenate([[0], np.cumsum(np.bincount(end_node, minlength=num_nodes))])
        token_ids = ids[np.argsort(end_node, kind="stable")]
        return cls(np.concatenate(edge_byte), child_start, child_count, token_start, token_ids)
