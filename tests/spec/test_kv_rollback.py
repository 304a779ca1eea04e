"""Speculative decoding's KV rollback, on the BlockManager state machine of tests/helpers/block_machine.py.

A verify step allocates slots for the last token and k proposals, writes K/V for all of them,
keeps an accepted prefix plus one token and truncates the block table. The machine's pool model
holds, at each slot, the token prefix the K/V there was computed from; so a rejected token's K/V
counted as computed, or a cached block holding one, shows up as a sequence (or a later prefix-cache
hit) reading back a history that is not its own.
"""
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from tests.helpers.block_machine import STATEFUL, TOKENS, PooledMachine, blocks_for
from tests.helpers.kv_model import apply_block_copies


class SpecMachine(PooledMachine):
    @precondition(lambda self: any(s.num_uncomputed_tokens == 1 for s in self.seqs))
    @rule(data=st.data())
    def verify(self, data):
        seq = data.draw(st.sampled_from([s for s in self.seqs if s.num_uncomputed_tokens == 1]))
        proposal = data.draw(st.lists(TOKENS, min_size=1, max_size=4))
        n = 1 + len(proposal)
        if not self.kv.can_allocate(seq, n):
            return
        self.kv.allocate(seq, n)
        copies = self.kv.take_copies()
        apply_block_copies(self.pool, copies, self.bm.block_size)
        known = seq.token_ids + proposal
        start = seq.num_computed_tokens
        for pos in range(start, start + n):  # the verify pass writes K/V for every proposal
            self.pool[self.bm.slot(seq, pos)] = tuple(known[: pos + 1])
        accepted = data.draw(st.integers(0, len(proposal)))
        # SpeculativeDecoder._append_verified: accepted proposals, then one corrected/bonus token differing from
        # the rejected proposal (the rejected one was written into the pool above)
        bonus = data.draw(TOKENS.filter(lambda t: accepted == len(proposal) or t != proposal[accepted]))
        for token in proposal[:accepted] + [bonus]:
            seq.num_computed_tokens = len(seq)
            seq.token_ids.append(token)
        self.kv.truncate(seq, seq.num_computed_tokens)
        assert len(seq.block_table) == blocks_for(seq.num_computed_tokens, self.bm.block_size)
        self.kv.cache_computed(seq)


class NoCacheSpec(SpecMachine):
    cache_kind = None


class HashCacheSpec(SpecMachine):
    cache_kind = "hash"


class RadixCacheSpec(SpecMachine):
    cache_kind = "radix"


TestSpecRollback = NoCacheSpec.TestCase
TestSpecRollback.settings = STATEFUL
TestSpecRollbackWithHashCache = HashCacheSpec.TestCase
TestSpecRollbackWithHashCache.settings = STATEFUL
TestSpecRollbackWithRadixCache = RadixCacheSpec.TestCase
TestSpecRollbackWithRadixCache.settings = STATEFUL
