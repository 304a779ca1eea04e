"""Chapter 04: a radix tree over token ids whose nodes own the KV blocks of their edge (SGLang's RadixAttention).

Each edge is a run of tokens whose length is a whole number of blocks, and its node holds
those blocks. Matching walks down from the root comparing tokens; a request that diverges
inside an edge splits that node at the last whole block they share, so both branches keep
the common part once. Because the cache hands out whole blocks (the unit a block table can
point at), a match is rounded down to a block boundary; with `block_size=1` the tree is
token-exact.

A running request locks the nodes on its path (lock_ref counts how many do). Only unlocked
leaves are evicted, least recently used first, from the end of their edge and only as many
blocks as the pool needs; evicting a leaf never breaks its parent, which may become an
evictable leaf in turn. Compare the hash cache, where evicting a middle block strands the
blocks after it.

Requests with a `cache_salt` (SamplingParams) walk a tree of their own, a root per salt, so
they share no node with other salts; a salt's root goes when its last leaf is evicted.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from ..core.sequence import Sequence
from .base import PrefixCache
from .hashing import salt_of


@dataclass(eq=False)
class RadixNode:
    tokens: tuple[int, ...]
    blocks: list[int]
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    depth: int = 0  # tokens from the root to the end of this node's edge
    salt: str | None = None  # a root: the cache_salt its tree belongs to


class RadixPrefixCache(PrefixCache[RadixNode]):
    def __init__(self, block_size: int):
        super().__init__(block_size)
        self.root = RadixNode((), [], None)
        self.roots: dict[str | None, RadixNode] = {None: self.root}  # a tree per cache_salt
        self.tree_blocks: set[int] = set()
        self.evictable_blocks = 0  # blocks in nodes with lock_ref == 0
        self._clock = itertools.count(1)

    # -- walking -------------------------------------------------------------------------------
    def _shared_blocks(self, node: RadixNode, tokens: list[int], pos: int) -> int:
        """How many of `node`'s blocks equal the blocks of `tokens` starting at `pos`."""
        bs, n = self.block_size, 0
        while n < len(node.blocks) and pos + (n + 1) * bs <= len(tokens):
            if tuple(tokens[pos + n * bs : pos + (n + 1) * bs]) != node.tokens[n * bs : (n + 1) * bs]:
                break
            n += 1
        return n

    def _walk(self, tokens: list[int], split: bool, salt: str | None = None):
        """Follow `tokens` down the salt's tree. Returns (deepest node fully matched, blocks matched).

        With split=True a match ending inside an edge splits that node there, so the
        returned node ends exactly at the matched prefix. A salt with no tree yet matches nothing.
        """
        node = self.roots.get(salt) or RadixNode((), [], None, salt=salt)
        bs, pos, blocks, now = self.block_size, 0, [], next(self._clock)
        while pos + bs <= len(tokens):
            child = node.children.get(tuple(tokens[pos : pos + bs]))
            if child is None:
                break
            n = self._shared_blocks(child, tokens, pos)
            child.last_access = now
            blocks += child.blocks[:n]
            if n < len(child.blocks):
                if split:
                    node = self._split(child, n)
                break
            node, pos = child, pos + len(child.tokens)
        return node, blocks

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut `node`'s edge after n blocks; the new upper half becomes its parent."""
        bs = self.block_size
        upper = RadixNode(node.tokens[: n * bs], node.blocks[:n], node.parent, lock_ref=node.lock_ref,
                          last_access=node.last_access, depth=node.parent.depth + n * bs)
        node.parent.children[upper.tokens[:bs]] = upper
        node.tokens, node.blocks, node.parent = node.tokens[n * bs :], node.blocks[n:], upper
        upper.children[node.tokens[:bs]] = node
        return upper

    # -- the PrefixCache interface -------------------------------------------------------------
    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]:
        return self._walk(token_ids, split=False, salt=salt)[1]

    def lock(self, seq: Sequence, blocks: list[int]) -> None:
        node, _ = self._walk(seq.token_ids[: len(blocks) * self.block_size], split=True, salt=salt_of(seq))
        self._set_lock(node, +1)
        self.handles[seq.seq_id] = node

    def insert(self, tokens: list[int], blocks: list[int], salt: str | None = None) -> tuple[RadixNode, list[int]]:
        """Add a block-aligned prefix; parts already in the tree keep the tree's blocks.
        Returns the node that ends it and the blocks the tree newly holds."""
        bs = self.block_size
        assert len(tokens) == len(blocks) * bs
        self.roots.setdefault(salt, RadixNode((), [], None, salt=salt))
        node, _ = self._walk(tokens, split=True, salt=salt)
        pos = node.depth
        if pos == len(tokens):
            return node, []
        leaf = RadixNode(tuple(tokens[pos:]), list(blocks[pos // bs :]), node,
                         last_access=next(self._clock), depth=len(tokens))
        node.children[leaf.tokens[:bs]] = leaf
        self.tree_blocks.update(leaf.blocks)
        self.evictable_blocks += len(leaf.blocks)
        return leaf, leaf.blocks

    def cache_computed(self, seq: Sequence) -> list[int]:
        """Insert the sequence's full computed blocks and move its lock down to the new end."""
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        held = self.handles.get(seq.seq_id)
        if num_full * self.block_size <= (held.depth if held else 0):
            return []
        node, new = self.insert(seq.token_ids[: num_full * self.block_size], seq.block_table[:num_full], salt_of(seq))
        self._set_lock(node, +1)  # lock the new path before unlocking the old one (they overlap)
        if held is not None:
            self._set_lock(held, -1)
        self.handles[seq.seq_id] = node
        return list(new)

    def fork(self, parent: Sequence, child: Sequence) -> list[int]:
        new = self.cache_computed(parent)
        node = self.handles.get(parent.seq_id)
        if node is not None:
            self._set_lock(node, +1)
            self.handles[child.seq_id] = node
        return new

    def release(self, seq: Sequence) -> None:
        node = self.handles.pop(seq.seq_id, None)
        if node is not None:
            self._set_lock(node, -1)

    def _set_lock(self, node: RadixNode, delta: int) -> None:
        while node.parent is not None:  # up to the root of its tree
            if node.lock_ref == 0 and delta > 0:
                self.evictable_blocks -= len(node.blocks)
            node.lock_ref += delta
            assert node.lock_ref >= 0
            if node.lock_ref == 0:
                self.evictable_blocks += len(node.blocks)
            node = node.parent

    def holds(self, block: int) -> bool:
        return block in self.tree_blocks

    def num_evictable_blocks(self) -> int:
        return self.evictable_blocks

    def num_cached_blocks(self) -> int:
        return len(self.tree_blocks)

    def nodes(self):
        """Every node but the roots, parents before children."""
        stack = [child for root in self.roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evict(self, num_blocks: int) -> list[int]:
        leaves = [(n.last_access, id(n), n) for n in self.nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = []
        while len(freed) < num_blocks and leaves:
            _, _, leaf = heapq.heappop(leaves)
            # Give back from the end of the edge, only as many blocks as asked: the rest of the
            # leaf is still a valid (shorter) prefix and stays cached.
            take = min(len(leaf.blocks), num_blocks - len(freed))
            for block in leaf.blocks[len(leaf.blocks) - take :]:
                self.tree_blocks.discard(block)
                freed.append(block)
            self.evictable_blocks -= take
            if take < len(leaf.blocks):
                leaf.blocks = leaf.blocks[: len(leaf.blocks) - take]
                leaf.tokens = leaf.tokens[: len(leaf.blocks) * self.block_size]
                leaf.depth -= take * self.block_size
                continue
            parent = leaf.parent
            del parent.children[leaf.tokens[: self.block_size]]
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
            elif parent.parent is None and not parent.children and parent is not self.root:
                del self.roots[parent.salt]  # a salt's tree with nothing left in it
        return freed
