"""Prefix caches (hash and radix) driven through a KVManager over a BlockManager, the way the engine drives them.

The cache holds one reference on each block it keeps: an idle cached block has a reference count of 1."""
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nano_infer.kv import BlockManager
from nano_infer.kv.manager import KVManager
from nano_infer.prefix import make_prefix_cache
from nano_infer.sampling_params import SamplingParams
from nano_infer.core.sequence import Sequence

PARAMS = SamplingParams(max_tokens=None)


def cached_blocks_in_use(bm, cache):
    """Blocks the cache counts as evictable although a block table still references them."""
    if cache.num_evictable_blocks() == 0:
        return []
    if hasattr(cache, "nodes"):  # radix: blocks of unlocked nodes
        idle = [b for node in cache.nodes() if node.lock_ref == 0 for b in node.blocks]
    else:
        idle = list(cache.idle)
    return [b for b in idle if bm.ref_count[b] > 1]


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_forked_child_keeps_its_cached_prefix_after_the_parent_finishes(kind):
    """n > 1: the engine forks right after the parent's prefill, before that step's cache_computed,
    and a child may go unscheduled in the step where the parent finishes. The child still reads
    the prompt's blocks, so the cache must not count them as evictable (nor evict them)."""
    bm = BlockManager(num_blocks=4, block_size=2)
    cache = make_prefix_cache(kind, bm.block_size)
    kv = KVManager(bm, cache)
    params = SamplingParams(max_tokens=4)
    parent = Sequence("r", [1, 2, 3, 4], params)
    kv.acquire(parent)
    kv.allocate(parent, 4)
    parent.num_computed_tokens = 4
    child = Sequence("r", [1, 2, 3, 4], params, index=1, token_ids=list(parent.token_ids))
    child.num_computed_tokens = parent.num_computed_tokens
    kv.fork(parent, child)  # OutputProcessor.fork
    parent.token_ids.append(9)
    child.token_ids.append(8)
    kv.cache_computed(parent)  # end of that step: only scheduled sequences are offered
    kv.finish(parent)  # the parent finishes

    assert cached_blocks_in_use(bm, cache) == []
    assert kv.num_available_blocks == bm.num_free_blocks + sum(
        1 for b in range(bm.num_blocks) if cache.holds(b) and bm.ref_count[b] == 1)
    kv.clear()  # must not evict the child's blocks
    assert all(bm.ref_count[b] == 1 + cache.holds(b) for b in child.block_table)


# -- a brute-force model: the cache holds a set of block-aligned prefixes -------------------------------
def token_lists(alphabet: int, max_size: int = 12):
    return st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=max_size)


class PrefixCacheMachine(RuleBasedStateMachine):
    """Sequences come and go through a BlockManager with the cache attached, as the scheduler drives it.

    The model is a dict from every cached block-aligned token prefix to the block holding its
    last block of K/V; the cache adds a prefix when a sequence offers it (cache_computed) and it
    is not cached yet, and drops it only through the "evict" events of the block log. A match
    must equal the longest chain of cached prefixes of the query.
    """

    kind = None

    @initialize(block_size=st.sampled_from([1, 2, 4]), num_blocks=st.integers(6, 16))
    def setup(self, block_size, num_blocks):
        self.bs = block_size
        self.max_len = max(2, num_blocks // 2 * block_size - 2)  # prompts leave room for others and decode
        self.alphabet = 2 if block_size > 1 else 3  # small, so prompts collide block by block
        self.bm = BlockManager(num_blocks, block_size, log=True)
        self.cache = make_prefix_cache(self.kind, block_size)
        self.kv = KVManager(self.bm, self.cache)
        self.cached: dict[tuple[int, ...], int] = {}  # prefix -> block
        self.prefix_of: dict[int, tuple[int, ...]] = {}  # block -> prefix
        self.offered: dict[Sequence, int] = {}  # hash cache: blocks a sequence already offered
        self.seqs: list[Sequence] = []
        self.seen: list[list[int]] = [[]]  # token lists to build colliding prompts from
        self.log_pos = 0

    # -- the model ---------------------------------------------------------------------------------
    def expected_match(self, tokens) -> list[int]:
        blocks = []
        for end in range(self.bs, len(tokens) + 1, self.bs):
            block = self.cached.get(tuple(tokens[:end]))
            if block is None:
                break
            blocks.append(block)
        return blocks

    def offer(self, seq: Sequence) -> None:
        """cache_computed: the sequence's full computed blocks, each cached unless its prefix already is.

        The hash cache offers each block once per admission (its handle counts those
        offered); the radix tree re-walks the whole path.
        """
        num_full = min(seq.num_computed_tokens // self.bs, len(seq.block_table))
        start = self.offered.get(seq, 0) if self.kind == "hash" else 0
        for i in range(start, num_full):
            prefix, block = tuple(seq.token_ids[: (i + 1) * self.bs]), seq.block_table[i]
            if prefix not in self.cached:
                assert block not in self.prefix_of, f"block {block} would cache two prefixes"
                self.cached[prefix], self.prefix_of[block] = block, prefix
        self.offered[seq] = max(self.offered.get(seq, 0), num_full)
        self.kv.cache_computed(seq)

    def read_log(self) -> list[int]:
        """Apply the evictions logged since the last call; returns the evicted blocks."""
        evicted = []
        for event in self.bm.log[self.log_pos :]:
            if event.op == "evict":
                assert event.ref_count == 0
                del self.cached[self.prefix_of.pop(event.block_id)]
                evicted.append(event.block_id)
        self.log_pos = len(self.bm.log)
        return evicted

    def admit(self, seq: Sequence) -> None:
        expected = self.expected_match(seq.token_ids)
        hit = self.kv.acquire(seq)
        assert seq.block_table == expected and hit == len(expected) * self.bs
        assert seq.num_computed_tokens == min(hit, len(seq) - 1)
        self.offered[seq] = 0
        self.seqs.append(seq)

    def drop(self, seq: Sequence) -> None:
        """Scheduler.finish and preemption: offer the computed blocks, unlock, free."""
        if seq.block_table:
            self.offer(seq)
        self.kv.free(seq)
        self.offered.pop(seq)
        self.seqs.remove(seq)

    # -- rules -------------------------------------------------------------------------------------
    @rule(data=st.data())
    def add(self, data):
        base = data.draw(st.sampled_from(self.seen))
        cut = data.draw(st.integers(0, len(base)))
        tail = data.draw(token_lists(self.alphabet, max_size=self.max_len - cut)) if cut < self.max_len else []
        tokens = base[:cut] + tail
        self.seen.append(tokens)
        self.admit(Sequence(f"r{len(self.seen)}", tokens, PARAMS))

    def compute(self, seq: Sequence, n: int, token: int) -> bool:
        """One scheduled chunk: allocate, write (copies done), advance, sample at the end, offer."""
        if not self.kv.can_allocate(seq, n):
            return False
        self.kv.allocate(seq, n)
        self.kv.take_copies()
        self.read_log()
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == len(seq):
            seq.token_ids.append(token)
        self.offer(seq)
        return True

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def step(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        n = data.draw(st.one_of(st.just(seq.num_uncomputed_tokens), st.integers(1, seq.num_uncomputed_tokens)))
        self.compute(seq, n, data.draw(st.integers(0, self.alphabet - 1)))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def run_to_the_end(self, data):
        """Prefill the rest, decode a few tokens, finish: a whole request in one rule."""
        seq = data.draw(st.sampled_from(self.seqs))
        for _ in range(data.draw(st.integers(1, 3))):
            if not self.compute(seq, seq.num_uncomputed_tokens, data.draw(st.integers(0, self.alphabet - 1))):
                break
        self.seen.append(list(seq.token_ids))
        self.drop(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.seqs))
        child = Sequence(parent.request_id, parent.prompt_token_ids, PARAMS, index=1, token_ids=list(parent.token_ids))
        child.num_computed_tokens = parent.num_computed_tokens
        self.offer(parent)  # PrefixCache.fork caches the parent's blocks first
        self.kv.fork(parent, child)
        self.offered[child] = self.offered[parent]
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def finish(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        self.seen.append(list(seq.token_ids))
        self.drop(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def preempt(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        self.drop(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.admit(seq)

    @rule(data=st.data())
    def match(self, data):
        base = data.draw(st.sampled_from(self.seen))
        cut = data.draw(st.integers(0, len(base)))
        query = base[:cut] + data.draw(st.lists(st.integers(0, self.alphabet - 1), max_size=6))
        assert self.cache.match(query) == self.expected_match(query)

    @precondition(lambda self: self.cache.num_evictable_blocks())
    @rule(num_blocks=st.integers(1, 5))
    def evict(self, num_blocks):
        lru_first = self.least_recently_used_evictable()
        evictable = self.cache.num_evictable_blocks()
        freed = self.kv.evict(num_blocks)
        evicted = self.read_log()
        assert freed == len(evicted) and freed >= min(num_blocks, evictable)
        if evicted:
            assert evicted[0] in lru_first, "evicted a block that was not the least recently used"

    def least_recently_used_evictable(self) -> set[int]:
        if self.kind == "hash":
            return set(list(self.cache.idle)[:1])
        leaves = [n for n in self.cache.nodes() if not n.children and n.lock_ref == 0]
        if not leaves:
            return set()
        oldest = min(n.last_access for n in leaves)
        return {b for n in leaves if n.last_access == oldest for b in n.blocks}

    # -- invariants ----------------------------------------------------------------------------------
    @invariant()
    def cache_holds_exactly_the_model(self):
        assert self.cache.num_cached_blocks() == len(self.cached)
        assert {b for b in range(self.bm.num_blocks) if self.cache.holds(b)} == set(self.prefix_of)

    @invariant()
    def blocks_are_free_referenced_or_cached(self):
        holders = Counter(b for seq in self.seqs for b in seq.block_table)
        free = list(self.bm.pool.free_blocks)
        assert len(free) == len(set(free))
        for block in range(self.bm.num_blocks):
            assert self.bm.ref_count[block] == holders[block] + self.cache.holds(block)
            assert (block in free) != (holders[block] > 0 or self.cache.holds(block))
        idle = {b for b in self.prefix_of if self.bm.ref_count[b] == 1}
        assert self.kv.num_available_blocks <= self.bm.num_free_blocks + len(idle)

    @invariant()
    def evictable_count_matches_the_structure(self):
        if self.kind == "hash":
            assert set(self.cache.idle) == {b for b in self.prefix_of if self.bm.ref_count[b] == 1}
            assert self.cache.num_evictable_blocks() == len(self.cache.idle)
            return
        # radix: parents stay while a child does, and locks count the sequences below
        for prefix in self.cached:
            for end in range(self.bs, len(prefix), self.bs):
                assert prefix[:end] in self.cached, "a cached prefix lost its parent"
        unlocked = 0
        for node in self.cache.nodes():
            assert len(node.tokens) == len(node.blocks) * self.bs > 0
            assert node.depth == node.parent.depth + len(node.tokens)
            assert node.parent.children[node.tokens[: self.bs]] is node
            handles = self.cache.handles
            holders = sum(1 for seq in self.seqs if seq.seq_id in handles and is_below(handles[seq.seq_id], node))
            assert node.lock_ref == holders, "lock_ref is not the number of sequences holding the node"
            if node.lock_ref == 0:
                assert all(self.bm.ref_count[b] == 1 for b in node.blocks), "an unlocked node's block is in use"
                unlocked += len(node.blocks)
        assert self.cache.num_evictable_blocks() == unlocked

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        for seq in list(self.seqs):
            self.drop(seq)
        self.kv.clear()
        self.read_log()
        assert self.cached == {} and self.cache.num_cached_blocks() == 0
        assert sorted(self.bm.pool.free_blocks) == list(range(self.bm.num_blocks))
        assert self.bm.ref_count == [0] * self.bm.num_blocks
        if self.kind == "radix":
            assert self.cache.root.children == {} and self.cache.num_evictable_blocks() == 0


def is_below(node, ancestor) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


class HashMachine(PrefixCacheMachine):
    kind = "hash"


class RadixMachine(PrefixCacheMachine):
    kind = "radix"


STATEFUL = settings(max_examples=60, stateful_step_count=50, deadline=None)
TestHashPrefixCache = HashMachine.TestCase
TestHashPrefixCache.settings = STATEFUL
TestRadixPrefixCache = RadixMachine.TestCase
TestRadixPrefixCache.settings = STATEFUL


# -- unit tests: the documented mechanics, one at a time ---------------------------------------------
def serve(kv, tokens):
    """A whole request: admit onto the cache, prefill the rest, finish. Returns the blocks it read."""
    seq = Sequence("r", list(tokens), PARAMS)
    kv.acquire(seq)
    n = seq.num_uncomputed_tokens
    kv.allocate(seq, n)
    kv.take_copies()
    seq.num_computed_tokens += n
    blocks = list(seq.block_table)
    kv.finish(seq)
    return blocks


def evicted(bm, start):
    return [e.block_id for e in bm.log[start:] if e.op == "evict"]


@pytest.mark.parametrize("block_size", [1, 2])
def test_a_request_that_diverges_inside_an_edge_splits_the_node(block_size):
    bm = BlockManager(num_blocks=16, block_size=block_size)
    cache = make_prefix_cache("radix", bm.block_size)
    kv = KVManager(bm, cache)
    a = serve(kv, [1, 2, 3, 4, 5, 6])
    (node,) = cache.root.children.values()
    assert node.tokens == (1, 2, 3, 4, 5, 6) and node.blocks == a

    b = Sequence("b", [1, 2, 3, 4, 9, 9], PARAMS)
    assert kv.acquire(b) == 4
    assert b.block_table == a[: 4 // block_size]
    (upper,) = cache.root.children.values()
    assert upper.tokens == (1, 2, 3, 4) and upper.blocks == a[: 4 // block_size] and upper.lock_ref == 1
    (lower,) = upper.children.values()
    assert lower.tokens == (5, 6) and lower.blocks == a[4 // block_size :] and lower.lock_ref == 0
    assert cache.handles[b.seq_id] is upper

    kv.allocate(b, 2)
    b.num_computed_tokens = 6
    kv.cache_computed(b)
    assert sorted(upper.children) == [(5, 6)[:block_size], (9, 9)[:block_size]]
    assert cache.match([1, 2, 3, 4, 5, 6]) == a
    assert cache.match([1, 2, 3, 4, 9, 9]) == a[: 4 // block_size] + b.block_table[4 // block_size :]
    assert cache.num_evictable_blocks() == len(lower.blocks)  # b holds the shared part and its own


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_eviction_takes_the_least_recently_used_first(kind):
    bm = BlockManager(num_blocks=6, block_size=2, log=True)
    cache = make_prefix_cache(kind, bm.block_size)
    kv = KVManager(bm, cache)
    prompts = {name: [t] * 4 for t, name in enumerate("abc", 1)}
    blocks = {name: serve(kv, p) for name, p in prompts.items()}
    assert cache.match(prompts["a"]) == blocks["a"]  # a hit makes a the most recently used
    for name in ["b", "c", "a"]:
        start = len(bm.log)
        assert kv.evict(2) == 2
        assert sorted(evicted(bm, start)) == sorted(blocks[name])
        assert cache.match(prompts[name]) == []
    assert cache.num_cached_blocks() == 0


def test_evicting_a_leaf_keeps_its_parent_matching():
    bm = BlockManager(num_blocks=8, block_size=2, log=True)
    cache = make_prefix_cache("radix", bm.block_size)
    kv = KVManager(bm, cache)
    shared = [1, 2, 3, 4]
    a = serve(kv, shared + [5, 6])
    b = serve(kv, shared + [7, 8])
    start = len(bm.log)
    assert kv.evict(1) == 1  # a's own block: the least recently used leaf
    assert evicted(bm, start) == a[2:]
    assert cache.match(shared + [5, 6]) == a[:2] == b[:2]
    assert cache.match(shared + [7, 8]) == b
    assert kv.evict(1) == 1 and cache.match(shared + [7, 8]) == b[:2]  # now the shared node is a leaf
    assert kv.evict(2) == 2 and cache.match(shared) == []


def test_hash_cache_evicts_a_chain_from_its_tail():
    """A hit marks the chain's head most recent, so eviction shortens a chain instead of stranding it.

    (A chain is only as long as its first missing block: evicting the head first would leave
    the rest held but unreachable.)
    """
    bm = BlockManager(num_blocks=4, block_size=2, log=True)
    cache = make_prefix_cache("hash", bm.block_size)
    kv = KVManager(bm, cache)
    a = serve(kv, [1, 1, 2, 2, 3, 3])
    assert cache.match([1, 1, 2, 2, 3, 3]) == a
    start = len(bm.log)
    assert kv.evict(1) == 1 and evicted(bm, start) == a[2:]
    assert cache.match([1, 1, 2, 2, 3, 3]) == a[:2] and cache.num_cached_blocks() == 2


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_a_fully_cached_prompt_recomputes_its_last_token_into_a_copy(kind):
    bm = BlockManager(num_blocks=4, block_size=2)
    cache = make_prefix_cache(kind, bm.block_size)
    kv = KVManager(bm, cache)
    a = serve(kv, [1, 2, 3, 4])
    seq = Sequence("b", [1, 2, 3, 4], PARAMS)
    assert kv.acquire(seq) == 4 and seq.num_computed_tokens == 3  # its logits give the first token
    assert bm.num_blocks_needed(seq, 1) == 1
    kv.allocate(seq, 1)
    assert bm.pending_copies == [(a[1], seq.block_table[1])] and seq.block_table[0] == a[0]
    assert cache.match([1, 2, 3, 4]) == a  # the cached block itself is never written


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_stats_count_a_preempted_request_once(kind):
    bm = BlockManager(num_blocks=8, block_size=2)
    cache = make_prefix_cache(kind, bm.block_size)
    kv = KVManager(bm, cache)
    serve(kv, [1, 2, 3, 4])
    seq = Sequence("r", [1, 2, 3, 4, 5], PARAMS)
    for _ in range(2):  # admitted, preempted (Scheduler._preempt), readmitted
        kv.acquire(seq)
        kv.allocate(seq, seq.num_uncomputed_tokens)
        kv.record_admission(seq)
        seq.num_computed_tokens = len(seq)
        seq.token_ids.append(0)
        kv.finish(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
    assert (cache.stats.num_queries, cache.stats.query_tokens, cache.stats.hit_tokens) == (1, 5, 4)
