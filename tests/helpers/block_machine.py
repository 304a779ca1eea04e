"""The BlockManager state machine shared by the KV tests: sequences share one BlockManager (under a
KVManager, with or without a prefix cache) and each step allocates, copies, then writes like LLMEngine.step.

The KV pool is modelled as a dict from slot to the whole token prefix that ends at that
slot's position: real K/V at position i depends on every token up to i (through the
layers), so a block read by the wrong sequence, or overwritten while another sequence
still reads it, shows up as a wrong prefix when a sequence reads its history back
through its block table.
"""
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nano_infer.kv import BlockManager
from nano_infer.kv.manager import KVManager
from nano_infer.prefix import make_prefix_cache
from nano_infer.sampling_params import SamplingParams
from nano_infer.core.sequence import Sequence
from tests.helpers.kv_model import apply_block_copies

PARAMS = SamplingParams(max_tokens=None)
TOKENS = st.integers(0, 2)  # a small alphabet, so prompts share prefixes and blocks


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class PooledMachine(RuleBasedStateMachine):
    """Sequences share one BlockManager; each step allocates, copies, then writes like LLMEngine.step."""

    cache_kind = None

    @initialize(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4]))
    def setup(self, num_blocks, block_size):
        self.bm = BlockManager(num_blocks, block_size, log=True)
        self.cache = make_prefix_cache(self.cache_kind, block_size)
        self.kv = KVManager(self.bm, self.cache)
        self.pool: dict[int, tuple[int, ...]] = {}
        self.seqs: list[Sequence] = []  # sequences that hold (or may hold) blocks
        self.num_requests = 0

    # -- helpers ---------------------------------------------------------------------------------
    def admit(self, seq: Sequence) -> None:
        if self.cache is not None:
            hit = self.kv.acquire(seq)
            assert hit % self.bm.block_size == 0 and len(seq.block_table) * self.bm.block_size == hit
            assert seq.num_computed_tokens == min(hit, len(seq) - 1)
        self.seqs.append(seq)

    def drop(self, seq: Sequence) -> None:
        """Scheduler.finish / preemption order: offer the computed blocks, unlock, free."""
        self.kv.finish(seq)
        assert seq.block_table == []
        self.seqs.remove(seq)

    def allocs_since(self, start: int) -> int:
        return sum(1 for e in self.bm.log[start:] if e.op == "alloc")

    # -- rules -----------------------------------------------------------------------------------
    @rule(prompt=st.lists(TOKENS, min_size=1, max_size=10))
    def add(self, prompt):
        self.num_requests += 1
        self.admit(Sequence(f"r{self.num_requests}", prompt, PARAMS))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def step(self, data):
        """One engine step: allocate for each scheduled sequence, run the copies, write K/V, advance."""
        batch = data.draw(st.lists(st.sampled_from(self.seqs), min_size=1, max_size=4, unique=True))
        scheduled = []
        for seq in batch:
            n = data.draw(st.integers(1, seq.num_uncomputed_tokens))
            needed = self.bm.num_blocks_needed(seq, n)
            if not self.kv.can_allocate(seq, n):
                assert needed > self.kv.num_available_blocks
                continue
            free_before, log_start = self.bm.num_free_blocks, len(self.bm.log)
            self.kv.allocate(seq, n)
            assert self.allocs_since(log_start) == needed
            if self.cache is None:
                assert self.bm.num_free_blocks == free_before - needed
            assert len(seq.block_table) == blocks_for(seq.num_computed_tokens + n, self.bm.block_size)
            scheduled.append((seq, n))

        copies = self.kv.take_copies()
        bs = self.bm.block_size
        apply_block_copies(self.pool, copies, bs)  # the runner copies whole blocks before the forward writes

        written = set()
        for seq, n in scheduled:
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                slot = self.bm.slot(seq, pos)
                assert slot not in written, f"two writes to slot {slot} in one step"
                written.add(slot)
                self.pool[slot] = tuple(seq.token_ids[: pos + 1])
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == len(seq):
                seq.token_ids.append(data.draw(TOKENS))
        for seq, _ in scheduled:
            self.kv.cache_computed(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        """SamplingParams(n>1): the child reads the parent's blocks and continues from the same tokens."""
        parent = data.draw(st.sampled_from(self.seqs))
        child = Sequence(parent.request_id, parent.prompt_token_ids, PARAMS, index=1,
                         token_ids=list(parent.token_ids))
        child.num_computed_tokens = parent.num_computed_tokens
        self.kv.fork(parent, child)
        assert child.block_table == parent.block_table
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish(self, data):
        self.drop(data.draw(st.sampled_from(self.seqs)))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def preempt(self, data):
        """Recompute preemption: drop the KV, keep the tokens, come back (onto the cache hit, if any)."""
        seq = data.draw(st.sampled_from(self.seqs))
        self.drop(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.admit(seq)

    @precondition(lambda self: self.cache is not None)
    @rule(num_blocks=st.integers(1, 4))
    def evict(self, num_blocks):
        before = self.bm.num_free_blocks
        freed = self.kv.evict(num_blocks)
        assert self.bm.num_free_blocks == before + freed

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def every_block_is_free_or_referenced_or_cached(self):
        free = list(self.bm.pool.free_blocks)
        assert len(free) == len(set(free)), "a block is on the free list twice"
        holders = Counter()
        for seq in self.seqs:
            assert len(seq.block_table) == len(set(seq.block_table)), "a block table lists a block twice"
            holders.update(seq.block_table)
        for block in range(self.bm.num_blocks):
            cached = self.kv.holds(block)
            assert self.bm.ref_count[block] == holders[block] + cached, f"block {block}: ref count vs holders"
            if block in free:
                assert holders[block] == 0 and not cached, f"free block {block} is still in use"
            else:
                assert holders[block] > 0 or cached, f"block {block} leaked: neither free, referenced nor cached"
        assert self.kv.num_available_blocks >= self.bm.num_free_blocks

    @invariant()
    def every_sequence_reads_back_its_own_history(self):
        for seq in self.seqs:
            assert len(seq.block_table) >= blocks_for(seq.num_computed_tokens, self.bm.block_size)
            assert len(seq.block_table) <= blocks_for(len(seq), self.bm.block_size)
            for pos in range(seq.num_computed_tokens):
                assert self.pool.get(self.bm.slot(seq, pos)) == tuple(seq.token_ids[: pos + 1]), (
                    f"seq {seq.seq_id} reads wrong K/V at position {pos}")

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq in list(self.seqs):
            self.drop(seq)
        if self.cache is not None:
            self.kv.clear()
            assert self.cache.num_cached_blocks() == 0
        assert sorted(self.bm.pool.free_blocks) == list(range(self.bm.num_blocks))
        assert self.bm.ref_count == [0] * self.bm.num_blocks


STATEFUL = settings(max_examples=60, stateful_step_count=30, deadline=None)
