"""The index cache: an owner never finds, nor evicts, another owner's entry; bytes stay within the budget."""
from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass

from hypothesis import given, settings, strategies as st

from nano_infer import SamplingParams
from nano_infer.constrained.constraint import constraint_key, token_index
from nano_infer.constrained.index_cache import OWNER_SHARE, SHARED, IndexCache
from nano_infer.constrained.limits import ConstraintLimits
from tests.helpers.byte_bpe import byte_bpe_vocabulary

BUDGET = 1000
OWNERS = ["a", "b", None, SHARED]


@dataclass(eq=False)
class FakeIndex:
    owner: object
    key: str
    max_bytes: int


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(OWNERS), st.sampled_from("pqrstu"), st.integers(1, 400)),
    st.tuples(st.just("get"), st.sampled_from(OWNERS), st.sampled_from("pqrstu")),
    st.tuples(st.just("tick"), st.floats(0, 40)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_owners_are_isolated_and_the_budget_holds(ops):
    clock = Clock()
    cache = IndexCache(per_owner=3, idle_seconds=60, clock=clock)
    used = {}  # (owner, key) -> when last put or found: the model of what may have expired
    for op in ops:
        if op[0] == "tick":
            clock.now += op[1]
            continue
        owner, key = op[1], op[2]
        fresh_before = {o: {k for k in cache.owned(o) if clock.now - used[(o, k)] <= 60} for o in OWNERS if o != owner}
        shared_before = cache.owned(SHARED)
        if op[0] == "put":
            got = cache.put(owner, key, FakeIndex(owner, key, op[3]), BUDGET)
            assert got.owner == owner and got.key == key  # never another owner's index, even for the same key
        else:
            got = cache.get(owner, key)
            assert got is None or (got.owner in (owner, SHARED) and got.key == key)
        if got is not None and key in cache.owned(got.owner):
            used[(got.owner, key)] = clock.now
        for other, keys in fresh_before.items():
            assert keys <= set(cache.owned(other)), (other, keys, cache.owned(other))
        if owner is not SHARED:  # the operator's entries never expire, nor go for a tenant
            assert set(shared_before) <= set(cache.owned(SHARED))
        for o in OWNERS:
            entries = cache._owners.get(o, {})
            assert len(entries) <= 3
            if o is not SHARED:
                assert sum(e.nbytes for e in entries.values()) <= BUDGET // OWNER_SHARE
        tenants = [e.nbytes for o, entries in cache._owners.items() if o is not SHARED for e in entries.values()]
        assert sum(tenants) <= BUDGET


def test_an_owner_evicts_its_own_least_recently_used_first():
    cache = IndexCache(per_owner=2)
    for key in "pq":
        cache.put("a", key, FakeIndex("a", key, 10), BUDGET)
    cache.put("b", "p", FakeIndex("b", "p", 10), BUDGET)
    assert cache.get("a", "p").owner == "a"  # p is now a's most recent
    cache.put("a", "r", FakeIndex("a", "r", 10), BUDGET)
    assert cache.owned("a") == ["p", "r"] and cache.owned("b") == ["p"]


def test_an_index_over_the_owners_share_serves_without_being_kept():
    cache = IndexCache()
    big = FakeIndex("a", "p", BUDGET // OWNER_SHARE + 1)
    assert cache.put("a", "p", big, BUDGET) is big and cache.get("a", "p") is None and cache.nbytes == 0


def test_the_operators_entries_are_read_by_all_and_never_refused_for_the_budget():
    cache = IndexCache()
    shared = FakeIndex(SHARED, "p", 2 * BUDGET)
    cache.put(SHARED, "p", shared, BUDGET)
    assert cache.get("a", "p") is shared and cache.get(None, "p") is shared
    for key in "qrstu":  # another owner filling its share evicts only its own
        cache.put("a", key, FakeIndex("a", key, BUDGET // OWNER_SHARE), BUDGET)
    assert cache.get("b", "p") is shared


def test_an_idle_entry_expires_for_its_owner_too():
    clock = Clock()
    cache = IndexCache(idle_seconds=60, clock=clock)
    cache.put("a", "p", FakeIndex("a", "p", 10), BUDGET)
    clock.now = 61
    assert cache.get("a", "p") is None and cache.nbytes == 0


def test_an_evicted_index_is_freed():
    cache = IndexCache(per_owner=1)
    index = FakeIndex("a", "p", 10)
    gone = weakref.ref(index)
    cache.put("a", "p", index, BUDGET)
    cache.put("a", "q", FakeIndex("a", "q", 10), BUDGET)
    del index
    gc.collect()
    assert gone() is None


def test_the_sync_path_caches_for_no_tenant_and_a_tenant_builds_its_own():
    vocab = byte_bpe_vocabulary()
    key = constraint_key(SamplingParams(regex="(yes|no)"))
    first = token_index(key, vocab)
    assert token_index(key, vocab) is first  # the sync LLM's path: cached as before
    theirs = token_index(key, vocab, ConstraintLimits(), owner="key 1")
    assert theirs is not first and token_index(key, vocab, owner="key 1") is theirs
