"""The host tier (stage 12) under random admissions, steps, swaps, forks, aborts and evictions:
KVManager + BlockManager + HostTier, with a hash cache, a radix tree, or no prefix cache.

Both pools are modelled as dicts, as in helpers/block_machine: a slot holds what real K/V at that
position depends on, the request's cache salt and every token up to it. The copies between the
tiers are applied to the dicts the way the engine runs them before a forward pass (BlockSwap):
device -> host first, then the copy-on-write copies, then host -> device. So a block
offloaded after it was overwritten, loaded into the wrong device block, swapped back into
another sequence's table, or served across salts shows up as a wrong history when a sequence
reads its positions back, through its block table on the device or through its swapped-out
host blocks.

The engine's order is kept where it matters: a "phase" is what one `Scheduler.schedule` does
(admissions, allocations, preemptions of sequences not scheduled yet) up to the copies; a
sequence scheduled in the phase is neither preempted, forked nor finished before its forward pass.
"""
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nano_infer.kv import BlockManager
from nano_infer.kv.cost import CostModel
from nano_infer.kv.host_tier import HostTier
from nano_infer.kv.manager import KVManager
from nano_infer.prefix import make_prefix_cache
from nano_infer.prefix.hashing import chain_hash, root_hash
from nano_infer.sampling_params import SamplingParams
from nano_infer.core.sequence import Sequence
from nano_infer.core.utils import cdiv
from tests.helpers.kv_model import copy_blocks

TOKENS = st.integers(0, 2)  # a small alphabet, so prompts share prefixes and blocks
# prompts share prefixes, as chats share a system prompt: the blocks evicted from one come back for another
SYSTEM = [0, 1, 2, 0, 1, 2, 2, 1]
PROMPTS = st.one_of(st.lists(TOKENS, min_size=1, max_size=10),
                    st.builds(lambda k, tail: SYSTEM[:k] + tail, st.integers(1, len(SYSTEM)), st.lists(TOKENS, max_size=4)))
SALTS = st.sampled_from([None, None, "t"])
MAX_LIVE = 4  # sequences at once: more would fill the small pools and leave nothing to evict, offload, load
PARAMS = {salt: SamplingParams(max_tokens=None, cache_salt=salt) for salt in (None, "t")}


def pending_loads(tier: HostTier) -> dict[int, int]:
    """device block -> host block of the loads and swap-ins queued."""
    return {d: h for d, (h, _) in tier.pending_in.items()}


def swapped_blocks(tier: HostTier, seq: Sequence) -> list[int]:
    """The host blocks holding a swapped-out sequence's K/V (none when it is not swapped out)."""
    swapped = tier.swapped.get(seq.seq_id)
    return swapped.blocks if swapped else []


def content(seq: Sequence, pos: int):
    """What the K/V at `pos` depends on: the salt (the cache keeps salts apart) and the tokens up to it."""
    return seq.params.cache_salt, tuple(seq.token_ids[: pos + 1])


class TierMachine(RuleBasedStateMachine):
    cache_kind = None

    @initialize(num_blocks=st.integers(2, 16), block_size=st.sampled_from([1, 2, 3]),
                host_blocks=st.integers(1, 10), mode=st.sampled_from(["swap", "auto", "recompute"]),
                rates=st.one_of(st.none(), st.tuples(st.floats(1e3, 1e6), st.floats(1, 1e3))))
    def setup(self, num_blocks, block_size, host_blocks, mode, rates):
        self.bs = block_size
        self.bm = BlockManager(num_blocks, block_size)
        self.cache = make_prefix_cache(self.cache_kind, block_size)
        self.tier = HostTier(host_blocks, block_size)
        cost = CostModel(bytes_per_block=1000)
        if rates is not None:  # "auto" then decides by them; unmeasured, it swaps
            cost.copy_bytes_per_s, cost.prefill_tokens_per_s = rates
        self.kv = KVManager(self.bm, self.cache, self.tier, cost, mode)
        self.device: dict[int, tuple] = {}  # device slot -> content
        self.host: dict[int, tuple] = {}  # host slot -> content
        self.running: list[Sequence] = []  # admitted: hold device blocks
        self.waiting: list[Sequence] = []  # preempted (swapped out: hold host blocks) or not admitted
        self.scheduled: dict[Sequence, tuple[int, int]] = {}  # this phase: seq -> (tokens, lookahead slots)
        self.seen: list[Sequence] = []  # every sequence ever, for the host index's contents
        self.num_requests = 0

    # -- helpers ---------------------------------------------------------------------------------
    def admit(self, seq: Sequence, data) -> None:
        """Scheduler._schedule_waiting for one sequence: acquire (device hit, then host hits loaded
        back, or a swapped sequence as it is), allocate the first chunk, or undo the admission."""
        swapped = list(swapped_blocks(self.tier, seq))
        computed = self.tier.num_swapped_tokens(seq)
        assert seq.num_computed_tokens == 0 and bool(swapped) == bool(computed)
        hit = self.kv.acquire(seq)
        if swapped:
            assert hit == 0 and seq.block_table == [] and seq.num_computed_tokens == computed
        else:
            assert hit % self.bs == 0 and len(seq.block_table) * self.bs == hit
            assert seq.num_computed_tokens == min(hit, len(seq) - 1)
            assert all(self.bm.ref_count[b] for b in seq.block_table)  # device hits, and host hits' new blocks
        n = data.draw(st.one_of(st.just(1), st.integers(1, seq.num_uncomputed_tokens)), label="first chunk")
        if self.kv.can_allocate(seq, n):
            self.kv.allocate(seq, n)
            self.kv.record_admission(seq)
            assert swapped_blocks(self.tier, seq) == [] and self.tier.num_swapped_tokens(seq) == 0
            if swapped:
                assert self.tier.pending_in.keys() >= set(seq.block_table[: len(swapped)])
                assert [pending_loads(self.tier)[b] for b in seq.block_table[: len(swapped)]] == swapped
            self.running.append(seq)
            self.scheduled[seq] = (n, 0)
        else:  # Scheduler._undo_admission: loads cancelled, a swapped sequence keeps its host blocks
            self.kv.free(seq)
            assert seq.block_table == [] and swapped_blocks(self.tier, seq) == swapped
            assert self.tier.num_swapped_tokens(seq) == computed
            seq.num_computed_tokens = 0
            assert all(self.bm.ref_count[d] for d in self.tier.pending_in), "a load into a freed block"
            self.waiting.append(seq)

    @property
    def num_live(self) -> int:
        return len(self.running) + len(self.waiting)

    def idle(self) -> list[Sequence]:
        """Sequences nothing is scheduled for in this phase (preemption, fork and finish take these)."""
        return [s for s in self.running if s not in self.scheduled] + self.waiting

    def pending_pools(self) -> tuple[dict, dict]:
        """Both pools as they will be once the queued copies run (without taking them)."""
        device, host = dict(self.device), dict(self.host)
        out = [(d, h) for h, (d, _) in self.tier.pending_out.items()]
        into = [(h, d) for d, h in pending_loads(self.tier).items()]
        copy_blocks(device, host, out, self.bs)
        copy_blocks(device, device, self.bm.pending_copies, self.bs)
        copy_blocks(host, device, into, self.bs)
        return device, host

    def drop(self, seq: Sequence) -> None:
        self.kv.finish(seq)
        assert seq.block_table == [] and swapped_blocks(self.tier, seq) == []
        (self.running if seq in self.running else self.waiting).remove(seq)

    # -- rules -----------------------------------------------------------------------------------
    @precondition(lambda self: self.num_live < MAX_LIVE)
    @rule(prompt=PROMPTS, salt=SALTS, data=st.data())
    def add(self, prompt, salt, data):
        """A new request; or another turn, or the same prompt again: an earlier sequence's tokens (a
        prefix, maybe extended) under its salt (a hit, perhaps from the host tier) or the other one (never a hit)."""
        if self.seen and data.draw(st.booleans(), label="again"):
            old = data.draw(st.sampled_from(self.seen))
            k = data.draw(st.integers(1, len(old.token_ids)))
            salt = old.params.cache_salt if data.draw(st.booleans(), label="same salt") else (
                "t" if old.params.cache_salt is None else None)
            prompt = old.token_ids[:k] + data.draw(st.lists(TOKENS, max_size=3))
            if self.cache is not None and data.draw(st.booleans(), label="after a while"):
                self.evict(self.cache.num_evictable_blocks())  # the chat comes back after the pool moved on
        self.num_requests += 1
        seq = Sequence(f"r{self.num_requests}", prompt, PARAMS[salt])
        self.seen.append(seq)
        self.admit(seq, data)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def readmit(self, data):
        """A preempted sequence comes back: swapped ones copy their blocks in, the others hit the caches."""
        seq = data.draw(st.sampled_from(self.waiting))
        self.waiting.remove(seq)
        self.admit(seq, data)

    @precondition(lambda self: any(s not in self.scheduled for s in self.running))
    @rule(data=st.data())
    def schedule(self, data):
        """A running sequence gets its next chunk (and, as with speculation, lookahead slots given back after)."""
        seq = data.draw(st.sampled_from([s for s in self.running if s not in self.scheduled]))
        n = data.draw(st.integers(1, seq.num_uncomputed_tokens))
        k = data.draw(st.integers(0, 2))
        if self.kv.can_allocate(seq, n + k):
            self.kv.allocate(seq, n + k)
            assert len(seq.block_table) == cdiv(seq.num_computed_tokens + n + k, self.bs)
            self.scheduled[seq] = (n, k)

    @precondition(lambda self: self.tier.pending_out or self.tier.pending_in or self.tier.releases
                  or self.bm.pending_copies)
    @rule()
    def run_copies(self):
        """What runs before a forward pass: out to the host, copy-on-write, back in (BlockSwap's order)."""
        pending_out = dict(self.tier.pending_out)
        held_host = {h for h, r in enumerate(self.tier.ref_count) if r}  # a swap-in's block is freed by the take
        out, into = self.kv.take_transfers()
        assert sorted(out) == sorted((d, h) for h, (d, _) in pending_out.items())
        assert len({h for _, h in out}) == len(out) and len({d for _, d in into}) == len(into)
        assert all(self.bm.ref_count[d] for _, d in into), "a load into a free device block"
        assert all(h in held_host for _, h in out), "an offload into a free host block"
        copy_blocks(self.device, self.host, out, self.bs)
        copy_blocks(self.device, self.device, self.kv.take_copies(), self.bs)
        copy_blocks(self.host, self.device, into, self.bs)
        assert self.tier.releases == [] and not self.tier.pending_in and not self.tier.pending_out

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def step(self, data):
        """One engine step: maybe schedule more, run the copies, write the K/V, advance, cache the full blocks."""
        more = [s for s in self.running if s not in self.scheduled]
        for seq in data.draw(st.lists(st.sampled_from(more), max_size=3, unique=True) if more else st.just([])):
            n = data.draw(st.integers(1, seq.num_uncomputed_tokens))
            if self.kv.can_allocate(seq, n):
                self.kv.allocate(seq, n)
                self.scheduled[seq] = (n, 0)
        self.run_copies()
        written = set()
        for seq, (n, k) in self.scheduled.items():
            if k:  # speculation's rollback: the unused lookahead slots go back
                self.kv.truncate(seq, seq.num_computed_tokens + n)
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                slot = self.bm.slot(seq, pos)
                assert slot not in written, f"two writes to slot {slot} in one step"
                assert self.bm.ref_count[seq.block_table[pos // self.bs]] == 1, "a write into a shared block"
                written.add(slot)
                self.device[slot] = content(seq, pos)
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == len(seq):
                seq.token_ids.append(data.draw(TOKENS))
        for seq in self.scheduled:
            self.kv.cache_computed(seq)
        self.scheduled = {}

    @precondition(lambda self: any(s not in self.scheduled for s in self.running))
    @rule(data=st.data(), swap=st.booleans())
    def preempt(self, data, swap):
        """Scheduler._preempt: swap out if the mode and the tier allow, else recompute (drop the K/V)."""
        seq = data.draw(st.sampled_from([s for s in self.running if s not in self.scheduled]))
        computed, table = seq.num_computed_tokens, list(seq.block_table)
        if swap and self.kv.swap_out(seq):
            assert seq.block_table == [] and seq.num_computed_tokens == computed
            assert self.tier.num_swapped_tokens(seq) == computed
            assert len(swapped_blocks(self.tier, seq)) == cdiv(computed, self.bs)
            for h, d in zip(swapped_blocks(self.tier, seq), table):  # copied from its own block, or a cached block already out
                assert self.tier.pending_out.get(h, (d, True)) == (d, True) and (
                    h in self.tier.pending_out or h in self.tier.block_key)
        else:
            assert seq.block_table == table, "a refused swap changed the sequence"
            self.kv.free(seq)
        seq.num_computed_tokens = 0  # re-admission starts it past what the caches (and the swap) hold
        seq.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.append(seq)

    @precondition(lambda self: any(self.idle()) and self.num_live < MAX_LIVE)
    @rule(data=st.data())
    def fork(self, data):
        """n > 1 or a beam: the child shares the parent's device blocks, or its host blocks if swapped out."""
        parent = data.draw(st.sampled_from(self.idle()))
        child = Sequence(parent.request_id, parent.prompt_token_ids, parent.params, index=1,
                         token_ids=list(parent.token_ids))
        child.num_computed_tokens = parent.num_computed_tokens
        self.kv.fork(parent, child)
        assert child.block_table == parent.block_table
        assert swapped_blocks(self.tier, child) == swapped_blocks(self.tier, parent)
        assert self.tier.num_swapped_tokens(child) == self.tier.num_swapped_tokens(parent)
        self.seen.append(child)
        (self.running if parent in self.running else self.waiting).append(child)

    @precondition(lambda self: any(self.idle()))
    @rule(data=st.data())
    def finish(self, data):
        """Finished, aborted, or a pruned beam: running, waiting, or swapped out."""
        self.drop(data.draw(st.sampled_from(self.idle())))

    @precondition(lambda self: self.cache is not None)
    @rule(num_blocks=st.integers(1, 4))
    def evict(self, num_blocks):
        """What allocate does when the free list is short: idle cached blocks go, to the host tier."""
        before, offloaded = self.bm.num_free_blocks, self.tier.stats.offloaded_blocks
        freed = self.kv.evict(num_blocks)
        assert self.bm.num_free_blocks == before + freed
        assert self.tier.stats.offloaded_blocks - offloaded <= freed

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def device_blocks_are_free_or_held(self):
        free = list(self.bm.pool.free_blocks)
        assert len(free) == len(set(free)), "a device block is on the free list twice"
        holders = Counter()
        for seq in self.running + self.waiting:
            assert len(seq.block_table) == len(set(seq.block_table)), "a block table lists a block twice"
            holders.update(seq.block_table)
        for block in range(self.bm.num_blocks):
            cached = self.kv.holds(block)
            assert self.bm.ref_count[block] == holders[block] + cached, f"device block {block}: ref count vs holders"
            assert (block in free) == (self.bm.ref_count[block] == 0), f"device block {block}: free list vs ref count"
            assert (block in self.kv.block_keys) == cached, f"device block {block}: tier key vs cache"
        assert all(not s.block_table for s in self.waiting)

    @invariant()
    def host_blocks_are_free_or_held(self):
        t = self.tier
        free = list(t.pool.free_blocks)
        assert len(free) == len(set(free)), "a host block is on the free list twice"
        holders = Counter(t.releases)  # loads (and swap-ins) whose copies are not taken yet
        for seq in self.running + self.waiting:
            host_blocks = swapped_blocks(t, seq)
            assert len(host_blocks) == len(set(host_blocks)), "a sequence lists a host block twice"
            holders.update(host_blocks)
            assert not (host_blocks and seq.block_table), "swapped out and on the device at once"
        assert set(t.swapped) <= {s.seq_id for s in self.waiting}, "the tier keeps a sequence that is not out"
        indexed = set(t.index.values())
        assert len(indexed) == len(t.index) == len(t.block_key) == len(t.lru) and indexed == set(t.lru)
        for h in range(t.num_blocks):
            assert t.ref_count[h] == holders[h] + (h in indexed), f"host block {h}: ref count vs holders"
            assert (h in free) == (t.ref_count[h] == 0), f"host block {h}: free list vs ref count"
        assert all(t.ref_count[h] > 0 for h in t.pending_out), "a copy out into a free host block"
        assert all(t.ref_count[h] > 0 for h in pending_loads(t).values()), "a load from a free host block"
        assert all(self.bm.ref_count[d] for d in t.pending_in), "a load into a free device block"
        assert all(v >= 0 for v in vars(t.stats).values())

    @invariant()
    def every_sequence_reads_back_its_own_history(self):
        device, host = self.pending_pools()
        for seq in self.running:
            assert len(seq.block_table) >= cdiv(seq.num_computed_tokens, self.bs)
            for pos in range(seq.num_computed_tokens):
                assert device.get(self.bm.slot(seq, pos)) == content(seq, pos), (
                    f"seq {seq.seq_id} reads wrong K/V at position {pos}")
        for seq in self.waiting:
            assert seq.num_computed_tokens == 0
            host_blocks, computed = swapped_blocks(self.tier, seq), self.tier.num_swapped_tokens(seq)
            if host_blocks:  # its K/V waits in the host tier, whole
                assert len(host_blocks) == cdiv(computed, self.bs)
                for pos in range(computed):
                    slot = host_blocks[pos // self.bs] * self.bs + pos % self.bs
                    assert host.get(slot) == content(seq, pos), (
                        f"swapped seq {seq.seq_id} has wrong K/V at position {pos} in the host tier")

    @invariant()
    def the_host_index_holds_what_its_keys_say(self):
        """Each indexed host block holds the K/V of the prefix its chained hash names (after the pending copies)."""
        if not self.tier.index:
            return
        prefixes = {}
        for seq in self.seen:
            salt, parent = seq.params.cache_salt, root_hash(seq.params.cache_salt)
            for i in range(len(seq.token_ids) // self.bs):
                parent = chain_hash(parent, tuple(seq.token_ids[i * self.bs : (i + 1) * self.bs]))
                prefixes[parent] = (salt, tuple(seq.token_ids[: (i + 1) * self.bs]))
        _, host = self.pending_pools()
        for h, block in self.tier.index.items():
            assert h in prefixes, f"host block {block} is indexed under a hash no sequence's prefix has"
            salt, tokens = prefixes[h]
            first = len(tokens) - self.bs
            for off in range(self.bs):
                assert host.get(block * self.bs + off) == (salt, tokens[: first + off + 1]), (
                    f"host block {block} holds the wrong K/V for its key")

    def teardown(self):
        if not hasattr(self, "bm"):
            return
        self.run_copies()  # what is scheduled runs; then every request is aborted
        self.scheduled = {}
        for seq in self.running + self.waiting:  # aborted wherever they are, swapped out included
            self.drop(seq)
        self.run_copies()  # the last loads' references end when their copies are taken
        self.kv.clear()
        t = self.tier
        assert sorted(self.bm.pool.free_blocks) == list(range(self.bm.num_blocks)) and not any(self.bm.ref_count)
        assert sorted(t.pool.free_blocks) == list(range(t.num_blocks)) and not any(t.ref_count), "host blocks leaked"
        assert t.num_free_blocks == t.num_blocks
        assert not t.index and not t.lru and not t.block_key and not self.kv.block_keys and not t.swapped
        if self.cache is not None:
            assert self.cache.num_cached_blocks() == 0


class NoCacheTierMachine(TierMachine):
    cache_kind = None


class HashCacheTierMachine(TierMachine):
    cache_kind = "hash"


class RadixCacheTierMachine(TierMachine):
    cache_kind = "radix"


STATEFUL = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestTierNoCache = pytest.mark.slow(NoCacheTierMachine.TestCase)
TestTierNoCache.settings = STATEFUL
TestTierHashCache = pytest.mark.slow(HashCacheTierMachine.TestCase)
TestTierHashCache.settings = STATEFUL
TestTierRadixCache = pytest.mark.slow(RadixCacheTierMachine.TestCase)
TestTierRadixCache.settings = STATEFUL


# -- the copies' order, one case the machine reaches rarely -------------------------------------------
def run_step(sched, kv, device: dict, host: dict, bs: int):
    """One engine step without a model: schedule, the copies in the order KVOffloader.adjust runs them
    (out to the host, the step's copy-on-write, back in), write the K/V, advance."""
    out = sched.schedule()
    to_host, to_device = kv.take_transfers()
    copy_blocks(device, host, to_host, bs)
    copy_blocks(device, device, out.copies, bs)
    copy_blocks(host, device, to_device, bs)
    for e in out.scheduled:
        for pos in range(e.start, e.end):
            device[kv.blocks.slot(e.seq, pos)] = content(e.seq, pos)
        e.seq.num_computed_tokens = e.end
        if e.end == len(e.seq):
            e.seq.token_ids.append(7)
    sched.update_from_output(out)
    return out


def test_a_copy_on_write_source_taken_for_a_swap_in_in_the_same_step_is_copied_before_it_is_overwritten():
    """A request whose whole prompt is cached copies its last block on write, leaving the cached original
    idle; a swapped-out sequence admitted after it in the same step can evict that original and get it
    as the first block it swaps into. Its copy-on-write must read the original's K/V, not the swapped-in one."""
    from nano_infer.engine.scheduler import Scheduler

    bs = 2
    kv = KVManager(BlockManager(6, bs), make_prefix_cache("hash", bs), HostTier(16, bs), CostModel(1000), "swap")
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64, policy="lpm")
    device, host = {}, {}
    prompt = [1, 2, 1, 2, 1, 2]
    first = Sequence("a", prompt, PARAMS[None])
    sched.add(first)
    run_step(sched, kv, device, host, bs)
    sched.finish(first, "length")  # its three blocks stay cached, idle
    swapped = Sequence("s", [0, 0, 0, 0, 0], PARAMS[None])
    sched.add(swapped)
    run_step(sched, kv, device, host, bs)
    sched.running.remove(swapped)
    sched._preempt(swapped)  # what _schedule_running does to its victim: swapped out (the mode is "swap")
    assert kv.tier.num_swapped_tokens(swapped)
    again = Sequence("a2", prompt, PARAMS[None])  # the longest cached prefix: scheduled first (LPM)
    sched.add(again)
    out = run_step(sched, kv, device, host, bs)
    assert [e.seq for e in out.scheduled] == [again, swapped]
    for seq in (again, swapped):
        for pos in range(seq.num_computed_tokens):
            assert device.get(kv.blocks.slot(seq, pos)) == content(seq, pos), f"{seq.request_id} reads wrong K/V at {pos}"
