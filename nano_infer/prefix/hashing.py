"""What a full block's key is: the one hash chain that the hash prefix cache (chapter 03) and the host tier
(chapter 12) both index blocks by.

Block i's hash is `chain_hash(hash of block i-1, token ids of block i)`, so it names the whole prefix up to
the end of that block: two equal blocks at different places in different prompts never collide. The first
block's parent is the root: `ROOT_HASH`, or a hash of the request's `cache_salt`, so that requests with
different salts share no block, not even the first. A `BlockKey` carries the parent and the tokens beside
the hash, so a hit is verified and a hash collision costs a miss, never a wrong answer.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from ..core.sequence import Sequence

ROOT_HASH = 0


def salt_of(seq: Sequence) -> str | None:
    """The sequence's cache_salt (beam search's parameters carry none)."""
    return getattr(seq.params, "cache_salt", None)


class BlockKey(NamedTuple):
    hash: int  # chained: names the whole prefix up to the end of the block
    parent: int  # the previous block's hash (the root's for the first block)
    tokens: tuple[int, ...]  # the block's own token ids


def chain_hash(parent_hash: int, tokens: tuple[int, ...]) -> int:
    return hash((parent_hash, tokens))


def root_hash(salt: str | None) -> int:
    return ROOT_HASH if salt is None else hash(("cache_salt", salt))


def block_keys(token_ids: list[int], block_size: int, salt: str | None = None,
               known: list[int] | None = None) -> Iterator[BlockKey]:
    """The keys of the full blocks of `token_ids`, front to back, after the first `len(known)` blocks whose
    hashes are `known` already. Lazy: a lookup that stops at its first miss hashes no further."""
    known = known or []
    parent = known[-1] if known else root_hash(salt)
    for start in range(len(known) * block_size, len(token_ids) - block_size + 1, block_size):
        tokens = tuple(token_ids[start : start + block_size])
        key = BlockKey(chain_hash(parent, tokens), parent, tokens)
        yield key
        parent = key.hash


class BlockHashes:
    """Each live sequence's chain of block hashes, extended as its blocks fill: computed once per block, since a
    sequence's tokens are only ever appended to. Keyed by `seq_id`; the KV manager forks and drops the chains."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.chains: dict[int, list[int]] = {}

    def of(self, seq: Sequence) -> list[int]:
        """The hashes of every full block of `seq`'s tokens."""
        chain = self.chains.setdefault(seq.seq_id, [])
        chain += [key.hash for key in block_keys(seq.token_ids, self.block_size, salt_of(seq), chain)]
        return chain

    def key(self, seq: Sequence, i: int) -> BlockKey:
        """The key of the sequence's full block i, read off its chain of hashes."""
        hashes, bs = self.of(seq), self.block_size
        parent = hashes[i - 1] if i else root_hash(salt_of(seq))
        return BlockKey(hashes[i], parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]))

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child's tokens start with the parent's: so does its chain."""
        self.chains[child.seq_id] = list(self.chains.get(parent.seq_id, ()))

    def drop(self, seq: Sequence) -> None:
        self.chains.pop(seq.seq_id, None)
