"""Each running sequence's open block, kept exact beside an 8-bit pool (chapter 14).

With `kv_cache_dtype` "int8" or "fp8" a query reads the K/V of earlier blocks rounded, and the K/V of its own
block, the one still filling, exact: query i sees token j exactly when both sit in the same block. The rule is
positional, so a prompt computed in chunks, a prefix-cache hit, a recompute after preemption and a speculative
verify all give the tokens they give without them. Rounding hurts most where attention weighs most: the
tokens just before a query, which is what an exact open block keeps.

A prefill chunk has its own tokens exact in the step; what a later step needs is the exact K/V of the tokens
already in its first block. So each running sequence holds a row of this table: `ring` blocks of exact K/V in
the model's dtype (2 with speculative decoding, whose verify may cross into the next block and roll back, else
1), block b of the sequence at ring position b % ring. The pool's tensor for it (`KVPool.open`) is indexed by
`slots`. A row is taken with the sequence's first blocks, freed with them, and copied when a sequence forks,
so a sequence that resumes elsewhere (swapped back in, a full prefix hit) resumes at a block boundary
(`resume_at`): its open block is computed again rather than carried.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class OpenBlocks:
    num_rows: int  # sequences that can hold an open block at once: max_num_seqs
    block_size: int
    ring: int = 1  # exact blocks a row keeps
    rows: dict[int, int] = field(default_factory=dict)  # seq_id -> its row
    pending_copies: list[tuple[int, int]] = field(default_factory=list)  # (src row, dst row), before the next step

    def __post_init__(self):
        self.free_rows = list(reversed(range(self.num_rows)))
        self.retiring: list[int] = []  # released rows a pending copy still reads

    def has_room(self, seq) -> bool:
        return seq.seq_id in self.rows or bool(self.free_rows)

    def take(self, seq) -> None:
        if seq.seq_id not in self.rows:
            if not self.free_rows:
                raise RuntimeError(f"every one of the {self.num_rows} open-block rows is taken (max_num_seqs)")
            self.rows[seq.seq_id] = self.free_rows.pop()

    def release(self, seq) -> None:
        """The row goes back; one a pending copy still reads from (a pruned beam's parent) after the copy."""
        row = self.rows.pop(seq.seq_id, None)
        if row is None:
            return
        self.pending_copies = [(src, dst) for src, dst in self.pending_copies if dst != row]
        (self.retiring if any(src == row for src, _ in self.pending_copies) else self.free_rows).append(row)

    def fork(self, parent, child) -> None:
        """The child continues the parent's open block: a copy of the parent's row."""
        if parent.seq_id in self.rows:
            self.take(child)
            self.pending_copies.append((self.rows[parent.seq_id], self.rows[child.seq_id]))

    def take_copies(self) -> list[tuple[int, int]]:
        """The row copies the runner does before the next forward pass; rows they read from go back after."""
        copies, self.pending_copies = self.pending_copies, []
        self.free_rows += self.retiring
        self.retiring = []
        return copies

    def resume_at(self, num_tokens: int) -> int:
        """Where a sequence that did not keep its open block starts computing: the block boundary at or before."""
        return num_tokens - num_tokens % self.block_size

    def slots(self, seq, start: int, end: int) -> list[int]:
        """The open-block slots of positions [start, end) of `seq`."""
        base, bs = self.rows[seq.seq_id] * self.ring, self.block_size
        return [(base + p // bs % self.ring) * bs + p % bs for p in range(start, end)]


class NoOpenBlocks:
    """The stand-in when K/V is stored in the model's dtype: every block is exact already."""

    ring = 0

    def has_room(self, seq) -> bool:
        return True

    def take(self, seq) -> None: ...
    def release(self, seq) -> None: ...
    def fork(self, parent, child) -> None: ...

    def take_copies(self) -> list[tuple[int, int]]:
        return []

    def resume_at(self, num_tokens: int) -> int:
        return num_tokens


def open_block_visible(q_pos: torch.Tensor, key_pos: torch.Tensor, open_pos: torch.Tensor, block_size: int):
    """Which keys each query sees when its own block is exact: bool [..., Q, keys + open].

    q_pos [..., Q, 1], key_pos [..., 1, S] (the pool's keys), open_pos [..., 1, E] (the exact copies). A pool key
    is visible before the query's block starts; an exact one in the query's block, up to the query."""
    q_block = q_pos // block_size
    return torch.cat(((key_pos < q_block * block_size).expand(*q_pos.shape[:-1], -1),
                      (open_pos <= q_pos) & (open_pos // block_size == q_block)), dim=-1)
