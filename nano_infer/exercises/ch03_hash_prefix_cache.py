"""Chapter 03 exercises: chained block hashes, and looking a prompt up in a hash -> block table."""
from __future__ import annotations

from hypothesis import strategies as st

from ..kv.block_manager import BlockManager
from ..prefix.hash_cache import HashPrefixCache
from ..prefix.hashing import block_keys
from ..sampling_params import SamplingParams
from ..core.sequence import Sequence
from .core import call, exercise, expect, forall

_tokens = st.lists(st.integers(0, 3), max_size=14)


def _hashes_by_engine(token_ids: list[int], block_size: int) -> list[int]:
    """The chain of hashes HashPrefixCache computes for a sequence whose tokens are all computed."""
    manager = BlockManager(64, block_size)
    cache = HashPrefixCache(block_size)
    seq = Sequence("x", list(token_ids) or [0], SamplingParams())
    seq.token_ids = list(token_ids)
    seq.num_computed_tokens = len(token_ids)
    manager.allocate(seq, 0)
    cache.cache_computed(seq)
    return list(cache.hashes.of(seq))


@exercise
def block_hashes(candidate):
    """Your chain equals the hash cache's: one key per full block, each covering the whole prefix."""

    def prop(case):
        tokens, block_size = case
        want = _hashes_by_engine(tokens, block_size)
        desc = f"token_ids={tokens}, block_size={block_size}"
        got = call(candidate, list(tokens), block_size, case=desc)
        expect(list(got) == want, desc, want, got, why="block hashes:")

    # equal blocks at different places (the second [1, 1] follows another prefix), and a partial last block
    forall(st.tuples(_tokens, st.integers(1, 4)), prop, examples=[([1, 1, 2, 2, 1, 1, 0], 2)])


def _lookup_reference(hash_to_block: dict, token_ids: list[int], block_size: int) -> list[int]:
    blocks = []
    for key in block_keys(token_ids, block_size):
        if key.hash not in hash_to_block:
            break
        blocks.append(hash_to_block[key.hash])
    return blocks


@st.composite
def _lookup_cases(draw):
    block_size = draw(st.integers(1, 3))
    cached = draw(st.lists(_tokens, max_size=4))
    query = draw(st.one_of(_tokens, st.sampled_from(cached or [[]]).flatmap(
        lambda c: st.tuples(st.integers(0, len(c)), _tokens).map(lambda t: c[:t[0]] + t[1]))))
    return block_size, cached, query


@exercise
def lookup_prefix(candidate):
    """Your lookup returns the cached blocks of the longest cached prefix, whole blocks only, stopping at the first miss."""

    def prop(case):
        block_size, cached, query = case
        table, next_block = {}, 0
        for tokens in cached:  # what the cache would hold after serving these prompts
            for h in _hashes_by_engine(tokens, block_size):
                if h not in table:
                    table[h], next_block = next_block, next_block + 1
        # cached prompts' blocks, some dropped (evicted) so that a chain can have a hole
        for h in list(table)[1::3]:
            del table[h]
        want = _lookup_reference(table, query, block_size)
        desc = f"block_size={block_size}, cache filled by {cached} (every third block evicted), token_ids={query}"
        got = call(candidate, dict(table), list(query), block_size, case=desc)
        expect(list(got) == want, desc, want, got, why="blocks matched:")

    forall(_lookup_cases(), prop, max_examples=50,
           examples=[(2, [[1, 2, 3, 4, 5, 6, 7, 8]], [1, 2, 3, 4, 5, 6, 7, 8]), (2, [[1, 2]], [1, 2])])
