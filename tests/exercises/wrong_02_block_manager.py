"""Planted wrong answers for chapter 02."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "solution_02", Path(__file__).resolve().parents[2] / "solutions" / "02_block_manager.py")
_solution = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_solution)


def slot_mapping__forgets_block_size(block_table, block_size, start, end):
    return [block_table[pos // block_size] + pos % block_size for pos in range(start, end)]


def slot_mapping__ignores_block_table(block_table, block_size, start, end):
    return list(range(start, end))


class fork_cow__fork_without_incref(_solution.CowBlockManager):
    def fork(self, parent_id, child_id):
        self.block_tables[child_id] = list(self.block_tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]


class fork_cow__writes_into_shared_block(_solution.CowBlockManager):
    def append_slot(self, seq_id):
        table, pos = self.block_tables[seq_id], self.lengths[seq_id]
        self.lengths[seq_id] += 1
        if pos % self.block_size == 0:
            table.append(self._take())
        return None


class fork_cow__copy_keeps_the_old_reference(_solution.CowBlockManager):
    def append_slot(self, seq_id):
        table, pos = self.block_tables[seq_id], self.lengths[seq_id]
        self.lengths[seq_id] += 1
        if pos % self.block_size == 0:
            table.append(self._take())
            return None
        last = table[-1]
        if self.ref_count[last] == 1:
            return None
        new = self._take()  # the missing decrement: `last` is never released by this sequence
        table[-1] = new
        return (last, new)
