"""Chapter 02 exercises: slot mapping through a block table, and a block manager with fork + copy-on-write."""
from __future__ import annotations

from hypothesis import strategies as st

from ..kv.block_manager import BlockManager
from ..core.sequence import Sequence
from ..sampling_params import SamplingParams
from ..core.utils import cdiv
from .core import Mismatch, call, exercise, expect, forall


@st.composite
def _slot_cases(draw):
    block_size = draw(st.integers(1, 8))
    table = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True))
    end = draw(st.integers(0, len(table) * block_size))
    start = draw(st.integers(0, end))
    return table, block_size, start, end


@exercise
def slot_mapping(candidate):
    """Your slots equal BlockManager.slot for every position, any block size and block table."""

    def prop(case):
        table, block_size, start, end = case
        manager = BlockManager(max(table) + 1, block_size)
        seq = Sequence("x", [0], SamplingParams())
        seq.block_table = list(table)
        want = [manager.slot(seq, pos) for pos in range(start, end)]
        desc = f"block_table={table}, block_size={block_size}, positions {start}..{end - 1}"
        got = call(candidate, list(table), block_size, start, end, case=desc)
        expect(list(got) == want, desc, want, got, why="slots:")

    forall(_slot_cases(), prop, examples=[([3, 0, 5], 4, 2, 9)])


# -- fork + copy-on-write -------------------------------------------------------------------------
NUM_BLOCKS = 48

_ops = st.lists(st.tuples(st.sampled_from(["new", "fork", "append", "append", "append", "free"]),
                          st.integers(0, 50)), min_size=1, max_size=24)


class _Simulation:
    """Runs ops on the learner's manager and keeps the K/V contents a real pool would hold.

    Every slot holds the label of the token written there; reading a sequence through its
    block table must give back its own tokens, whatever blocks the manager chose.
    """

    def __init__(self, manager_cls, block_size: int):
        self.bs = block_size
        self.m = call(manager_cls, NUM_BLOCKS, block_size, case=f"{manager_cls.__name__}({NUM_BLOCKS}, {block_size})")
        self.pool: dict[int, list] = {}
        self.tokens: dict[int, list[str]] = {}  # what each live sequence must read back
        self.history: list[str] = []
        self.next_id = 0

    def where(self) -> str:
        return f"block_size={self.bs}, after " + "; ".join(self.history)

    def blocks_in_use(self) -> set[int]:
        return {b for t in self.m.block_tables.values() for b in t}

    def write(self, seq_id: int, pos: int, label: str) -> None:
        table = self.m.block_tables[seq_id]
        block = table[pos // self.bs]
        self.pool.setdefault(block, [None] * self.bs)[pos % self.bs] = label

    def op(self, kind: str, arg: int) -> None:
        live = sorted(self.tokens)
        free = NUM_BLOCKS - len(self.blocks_in_use())
        if kind == "new" or not live:
            n = 1 + arg % (3 * self.bs)
            if cdiv(n, self.bs) > free:
                return
            sid, self.next_id = self.next_id, self.next_id + 1
            self.history.append(f"allocate({sid}, {n})")
            call(self.m.allocate, sid, n, case=self.where())
            self.tokens[sid] = [f"s{sid}t{i}" for i in range(n)]
            for i, label in enumerate(self.tokens[sid]):
                self.write(sid, i, label)
        elif kind == "fork":
            parent = live[arg % len(live)]
            sid, self.next_id = self.next_id, self.next_id + 1
            self.history.append(f"fork({parent}, {sid})")
            call(self.m.fork, parent, sid, case=self.where())
            self.tokens[sid] = list(self.tokens[parent])
        elif kind == "append":
            if free < 2:
                return
            sid = live[arg % len(live)]
            self.history.append(f"append_slot({sid})")
            copy = call(self.m.append_slot, sid, case=self.where())
            if copy is not None:
                src, dst = copy
                self.pool[dst] = list(self.pool.get(src, [None] * self.bs))
            label = f"s{sid}t{len(self.tokens[sid])}"
            self.tokens[sid].append(label)
            self.write(sid, len(self.tokens[sid]) - 1, label)
        else:
            sid = live[arg % len(live)]
            self.history.append(f"free({sid})")
            call(self.m.free, sid, case=self.where())
            del self.tokens[sid]
        self.verify()

    def verify(self) -> None:
        tables = self.m.block_tables
        expect(set(tables) == set(self.tokens), self.where(), sorted(self.tokens), sorted(tables),
               why="block_tables should have one entry per live sequence:")
        for sid, tokens in self.tokens.items():
            table = tables[sid]
            expect(len(table) == cdiv(len(tokens), self.bs), self.where(), cdiv(len(tokens), self.bs), len(table),
                   why=f"sequence {sid} has {len(tokens)} tokens; number of blocks in its table:")
            read = [self.pool.get(table[i // self.bs], [None] * self.bs)[i % self.bs] for i in range(len(tokens))]
            if read != tokens:
                bad = next(i for i, (a, b) in enumerate(zip(read, tokens)) if a != b)
                raise Mismatch(self.where(), tokens[bad], read[bad],
                               why=f"sequence {sid} reads the wrong K/V at position {bad} (block {table[bad // self.bs]}): "
                                   "a block it shares was overwritten or reused. Token label expected vs read:")
        want_free = NUM_BLOCKS - len(self.blocks_in_use())
        got_free = self.m.num_free_blocks
        expect(got_free == want_free, self.where(), want_free, got_free,
               why="num_free_blocks should be the blocks no block table uses (a leak, or a block freed while in use):")


@st.composite
def _cow_cases(draw):
    return draw(st.integers(1, 4)), draw(_ops)


@exercise
def fork_cow(candidate):
    """Your manager keeps every sequence's K/V intact through fork, append (copy-on-write) and free, leaking no block."""

    def prop(case):
        block_size, ops = case
        sim = _Simulation(candidate, block_size)
        for kind, arg in ops:
            sim.op(kind, arg)
        while sim.tokens:  # free everything: every block must come back
            sim.op("free", 0)

    forall(_cow_cases(), prop, max_examples=50,
           examples=[(2, [("new", 2), ("fork", 0), ("append", 0), ("append", 1), ("free", 0)])])
