"""Pack one scheduled step, run the model, return logits of the rows that sample.

For each scheduled sequence the step computes tokens [num_computed, num_computed + n):
their ids and positions go into the packed batch, their slots (where K/V is written) into
the slot mapping. A sequence samples a token only when the step reaches its last known
token; a prefill chunk in the middle of a prompt produces no logits.

A step is packed in two stages: `pack` turns the scheduled sequences into a `StepInput` of
plain lists (what a tensor-parallel driver sends its workers), `build` turns that into the
tensors the model reads. Every rank runs `execute` on the same StepInput.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention import AttentionBackend, AttentionMetadata, DecodeBatch, SeqSlice
from .sequence import Sequence

# Decodes per attention call on CPU. Each call pads to its own longest context, so sorting by length
# and cutting into batches copies less padding; past ~32 rows a bigger call saves little per-call
# overhead (measured: 8 -> 32 rows was +3-7% per workload). On a GPU one call for all decodes is
# cheaper than several kernel launches.
CPU_DECODE_BATCH = 32


@dataclass
class StepInput:
    """One packed step as plain lists: small to pickle, the same on every tensor-parallel rank."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int] | None  # None without a KV cache
    prefills: list[tuple[int, int, int, list[int] | None]]  # (q_start, q_len, context_len, block_table)
    decodes: list[tuple[int, list[list[int]], list[int]]]  # (first row, block tables padded, context lens)
    sample_rows: list[int]  # rows whose logits are sampled, in scheduled order
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks, before the step


class ModelRunner:
    def __init__(self, model, kv_pool, attention: str, block_size: int, device: torch.device, executor=None):
        self.model = model
        self.executor = executor  # nano_infer.distributed.TPExecutor on a tensor-parallel driver
        self.kv_pool = kv_pool
        self.block_size = block_size
        self.device = device
        self.backend = AttentionBackend("dense" if kv_pool is None else attention, kv_pool.tensor if kv_pool else None)
        self.decode_batch = CPU_DECODE_BATCH if device.type == "cpu" else 1 << 16
        self.num_forward_tokens = 0  # tokens pushed through the model so far (prefill work done)

    def _slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        """(ids, positions, AttentionMetadata, sample_rows) of the step: `build(pack(scheduled))`."""
        step = self.pack(scheduled)
        ids, pos, meta = self.build(step)
        return ids, pos, meta, step.sample_rows

    def pack(self, scheduled: list[tuple[Sequence, int]], copies: list[tuple[int, int]] | None = None) -> StepInput:
        """Decodes come first, sorted by context length, so every decode batch is one contiguous run
        of rows; prefill chunks follow. Logit rows are listed in `scheduled` order."""
        cached = self.kv_pool is not None
        decodes = sorted((i for i, (_, n) in enumerate(scheduled) if n == 1 and cached),
                         key=lambda i: scheduled[i][0].num_computed_tokens)
        is_decode = set(decodes)
        input_ids, positions, slot_mapping, prefills, last_row = [], [], [], [], {}
        for i in decodes + [i for i in range(len(scheduled)) if i not in is_decode]:
            seq, n = scheduled[i]
            start = seq.num_computed_tokens
            q_start = len(input_ids)
            input_ids += seq.token_ids[start : start + n]
            positions += range(start, start + n)
            if cached:
                slot_mapping += self._slots(seq, start, start + n)
            if i not in is_decode:
                num_blocks = -(-(start + n) // self.block_size)
                prefills.append((q_start, n, start + n, seq.block_table[:num_blocks] if cached else None))
            last_row[i] = q_start + n - 1
        sample_rows = [last_row[i] for i, (seq, n) in enumerate(scheduled) if seq.num_computed_tokens + n == len(seq)]
        seqs = [scheduled[i][0] for i in decodes]
        decode_batches = []
        for start in range(0, len(seqs), self.decode_batch):
            batch = seqs[start : start + self.decode_batch]
            width = -(-(batch[-1].num_computed_tokens + 1) // self.block_size)  # the longest is last
            decode_batches.append((start, [(s.block_table + [0] * width)[:width] for s in batch],
                                   [s.num_computed_tokens + 1 for s in batch]))
        return StepInput(input_ids, positions, slot_mapping if cached else None, prefills, decode_batches,
                         sample_rows, copies or [])

    def build(self, step: StepInput):
        """(ids, positions, AttentionMetadata) on this rank's device; decode block tables and masks are
        built once per step for all layers."""
        dev, bs = self.device, self.block_size
        meta = AttentionMetadata(
            slot_mapping=None if step.slot_mapping is None else torch.tensor(step.slot_mapping, device=dev),
            prefills=[SeqSlice(q_start, q_len, context_len, None if table is None else torch.tensor(table, device=dev))
                      for q_start, q_len, context_len, table in step.prefills],
            block_size=bs,
        )
        for start, tables, lens in step.decodes:
            context_lens = torch.tensor(lens, device=dev)
            tables = torch.tensor(tables, device=dev)
            hidden = torch.arange(tables.shape[1] * bs, device=dev) >= context_lens[:, None]
            mask = torch.zeros(hidden.shape, dtype=self.kv_pool.dtype, device=dev).masked_fill_(hidden, float("-inf"))
            meta.decodes.append(DecodeBatch(start, start + len(lens), tables, context_lens, mask.view(len(lens), 1, 1, -1)))
        return torch.tensor(step.input_ids, device=dev), torch.tensor(step.positions, device=dev), meta

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]], copies: list[tuple[int, int]]) -> torch.Tensor:
        """Logits [rows that sample, vocab] in float32. With tensor parallelism the executor first sends
        the step to every worker, which runs `execute` on it in lockstep."""
        step = self.pack(scheduled, copies)
        if self.executor is not None:
            return self.executor.run(step, self.execute)
        return self.execute(step)

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor | None:
        """Copy-on-write, forward, logits of the sampled rows (None on a tensor-parallel worker)."""
        if step.copies:
            self.kv_pool.copy_blocks(step.copies)
        ids, pos, meta = self.build(step)
        self.backend.meta = meta
        hidden = self.model(ids, pos, self.backend)
        self.num_forward_tokens += len(ids)
        logits = self.model.compute_logits(hidden[step.sample_rows])
        return None if logits is None else logits.float()
