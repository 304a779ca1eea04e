"""Chapter 02, reference solutions: `check.slot_mapping`, `check.fork_cow`."""


def slot_mapping(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    """The pool slot of every position start..end-1 of a sequence with this block table."""
    return [block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]


class CowBlockManager:
    """Blocks with reference counts; fork shares them, the first write into a shared block copies it."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))
        self.ref_count = [0] * num_blocks
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}  # tokens per sequence

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def _take(self) -> int:
        block = self.free_blocks.pop()
        self.ref_count[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.free_blocks.append(block)

    def allocate(self, seq_id: int, num_tokens: int) -> None:
        """A new sequence holding num_tokens tokens."""
        self.block_tables[seq_id] = [self._take() for _ in range(-(-num_tokens // self.block_size))]
        self.lengths[seq_id] = num_tokens

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child starts with the parent's tokens, reading the parent's blocks (no copy yet)."""
        table = list(self.block_tables[parent_id])
        for block in table:
            self.ref_count[block] += 1
        self.block_tables[child_id] = table
        self.lengths[child_id] = self.lengths[parent_id]

    def append_slot(self, seq_id: int):
        """Room for one more token. Returns (src, dst) if a shared block had to be copied, else None."""
        table, pos = self.block_tables[seq_id], self.lengths[seq_id]
        self.lengths[seq_id] += 1
        if pos % self.block_size == 0:  # the last block is full (or there is none): a fresh block
            table.append(self._take())
            return None
        last = table[-1]
        if self.ref_count[last] == 1:
            return None
        new = self._take()  # someone else reads this block: write into a copy
        self._release(last)
        table[-1] = new
        return (last, new)

    def free(self, seq_id: int) -> None:
        for block in self.block_tables.pop(seq_id):
            self._release(block)
        del self.lengths[seq_id]


fork_cow = CowBlockManager  # the check takes the class
