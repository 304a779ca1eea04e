"""KV invariants under random allocate / append / fork / free / evict: the BlockManager alone, and
under a KVManager with a prefix cache on top (the state machine of tests/helpers/block_machine.py),
then the documented mechanics one at a time.
"""
import pytest

from nano_infer.kv import BlockManager, NoFreeBlocksError
from nano_infer.core.sequence import Sequence
from tests.helpers.block_machine import PARAMS, STATEFUL, PooledMachine


class NoCacheMachine(PooledMachine):
    cache_kind = None


class HashCacheMachine(PooledMachine):
    cache_kind = "hash"


class RadixCacheMachine(PooledMachine):
    cache_kind = "radix"


TestBlockManager = NoCacheMachine.TestCase
TestBlockManager.settings = STATEFUL
TestBlockManagerWithHashCache = HashCacheMachine.TestCase
TestBlockManagerWithHashCache.settings = STATEFUL
TestBlockManagerWithRadixCache = RadixCacheMachine.TestCase
TestBlockManagerWithRadixCache.settings = STATEFUL


# -- unit tests: the documented mechanics, one at a time --------------------------------------------
def seq_with(tokens):
    return Sequence("r", list(tokens), PARAMS)


def compute(bm, seq, n):
    bm.allocate(seq, n)
    seq.num_computed_tokens += n


def test_allocate_takes_whole_blocks_and_maps_slots_through_the_block_table():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = seq_with(range(6))
    assert bm.num_blocks_needed(seq, 6) == 2
    compute(bm, seq, 6)
    assert len(seq.block_table) == 2 and bm.num_free_blocks == 2
    assert bm.num_blocks_needed(seq, 2) == 0  # positions 6 and 7 fit in the second block
    b0, b1 = seq.block_table
    assert [bm.slot(seq, p) for p in (0, 3, 4, 5)] == [b0 * 4, b0 * 4 + 3, b1 * 4, b1 * 4 + 1]
    bm.free(seq)
    assert bm.num_free_blocks == 4 and bm.ref_count == [0, 0, 0, 0]


def test_fork_shares_blocks_and_the_first_write_into_a_shared_block_copies_it():
    bm = BlockManager(num_blocks=4, block_size=4, log=True)
    parent = seq_with(range(6))
    compute(bm, parent, 6)
    child = Sequence("r", parent.prompt_token_ids, PARAMS, index=1, token_ids=list(parent.token_ids))
    child.num_computed_tokens = 6
    bm.fork(parent, child)
    full, partial = parent.block_table
    assert bm.ref_count[full] == bm.ref_count[partial] == 2
    assert bm.num_blocks_needed(child, 1) == 1  # position 6 lands in the shared partial block
    compute(bm, child, 1)
    assert bm.pending_copies == [(partial, child.block_table[1])]
    assert child.block_table[0] == full and child.block_table[1] != partial
    assert bm.ref_count[partial] == 1 and bm.ref_count[full] == 2
    assert [e.op for e in bm.log[-2:]] == ["free", "cow"]
    compute(bm, parent, 1)  # the parent is now alone on its block: no copy
    assert parent.block_table[1] == partial and len(bm.pending_copies) == 1


def test_the_block_freed_last_is_taken_first():
    """A stack, not a queue: reused blocks are the ones whose memory was touched last (resident, likely cached)."""
    bm = BlockManager(8, 2)
    a, b = Sequence("a", [1, 2, 3], PARAMS), Sequence("b", [4, 5, 6, 7], PARAMS)
    bm.allocate(a, 3)
    bm.allocate(b, 4)
    assert a.block_table == [0, 1] and b.block_table == [2, 3]  # a fresh pool hands out blocks in order
    freed = list(a.block_table)
    bm.free(a)
    c = Sequence("c", [8, 9, 1], PARAMS)
    bm.allocate(c, 3)
    assert c.block_table == freed  # not blocks 4 and 5, which were never written


def test_cannot_allocate_beyond_the_pool():
    bm = BlockManager(num_blocks=2, block_size=2)
    seq = seq_with(range(5))
    assert bm.num_blocks_needed(seq, 5) == 3 and not bm.can_allocate(seq, 5)
    assert bm.can_allocate(seq, 4)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(seq, 5)


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0)])
def test_bad_sizes_are_rejected(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockManager(num_blocks, block_size)
