"""The rows of exact open blocks beside an 8-bit pool (kv/open_blocks.py): who holds which row under random
take / release / fork / copy, where a position's slot is, and the block manager refusing a sequence no row is left for."""
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from nano_infer.core.sequence import Sequence
from nano_infer.kv import BlockManager
from nano_infer.kv.open_blocks import OpenBlocks
from tests.helpers.block_machine import PARAMS

OPS = st.lists(st.tuples(st.sampled_from(["take", "release", "fork", "copies"]), st.integers(0, 7), st.integers(0, 7)),
               max_size=60)


@settings(max_examples=150, deadline=None)
@given(num_rows=st.integers(1, 5), ring=st.sampled_from([1, 2]), ops=OPS)
def test_every_row_is_held_once_free_or_waiting_for_its_copy(num_rows, ring, ops):
    rows = OpenBlocks(num_rows, 4, ring)
    seqs = [SimpleNamespace(seq_id=i) for i in range(8)]
    for op, a, b in ops:
        if op == "take" and rows.has_room(seqs[a]):
            rows.take(seqs[a])
        elif op == "release":
            rows.release(seqs[a])
        elif op == "fork" and a != b and seqs[b].seq_id not in rows.rows and rows.has_room(seqs[b]):
            rows.fork(seqs[a], seqs[b])
            if seqs[a].seq_id in rows.rows:
                assert (rows.rows[a], rows.rows[b]) in rows.pending_copies
        elif op == "copies":
            for src, dst in rows.take_copies():
                assert dst in rows.rows.values()  # a copy runs only into a row someone still holds
            assert not rows.retiring
        held = list(rows.rows.values())
        # a partition of the rows: held (once each), free, or released but still read by a pending copy
        assert sorted(held + rows.free_rows + rows.retiring) == list(range(num_rows))
        for src, dst in rows.pending_copies:
            assert dst in held and (src in held or src in rows.retiring)


@given(row=st.integers(0, 3), ring=st.sampled_from([1, 2]), block_size=st.integers(1, 6), start=st.integers(0, 40))
def test_a_position_has_its_rows_slot_for_its_block_in_the_ring(row, ring, block_size, start):
    rows = OpenBlocks(4, block_size, ring)
    seq = SimpleNamespace(seq_id=9)
    for i in range(row):  # rows 0..row-1 taken by others first
        rows.take(SimpleNamespace(seq_id=i))
    rows.take(seq)
    assert rows.rows[seq.seq_id] == row
    window = ring * block_size
    row_slots = range(row * window, (row + 1) * window)  # the row's place in KVPool.open
    slots = rows.slots(seq, start, start + 2 * window)
    assert all(s in row_slots for s in slots)
    aligned = start - start % block_size  # a window of whole blocks holds every slot of the row once
    assert sorted(rows.slots(seq, aligned, aligned + window)) == list(row_slots)
    assert slots[:window] == slots[window:]  # block b and block b + ring share their place


def test_the_block_manager_admits_no_more_sequences_than_it_has_rows():
    rows = OpenBlocks(2, 4)
    bm = BlockManager(16, 4, open_blocks=rows)
    a, b, c = (Sequence("r", [1, 2, 3], PARAMS) for _ in range(3))
    for s in (a, b):
        assert bm.can_allocate(s, 3)
        bm.allocate(s, 3)
    assert not bm.can_allocate(c, 3)  # blocks are free, rows are not
    bm.free(a)
    assert bm.can_allocate(c, 3)
    bm.allocate(c, 3)
    bm.free(b)
    bm.fork(c, a)  # the fork takes the row `a` gave back, and a copy of `c`'s
    assert rows.take_copies() == [(rows.rows[c.seq_id], rows.rows[a.seq_id])]
