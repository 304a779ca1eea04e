"""Pack one scheduled step into tensors, run the model, return logits of the rows that sample.

For each scheduled sequence the step computes tokens [num_computed, num_computed + n):
their ids and positions go into the packed batch, their slots (where K/V is written) into
the slot mapping. A sequence samples a token only when the step reaches its last known
token; a prefill chunk in the middle of a prompt produces no logits.
"""
from __future__ import annotations

import torch

from .attention import AttentionBackend, AttentionMetadata, DecodeBatch, SeqSlice
from .sequence import Sequence

# Decodes per attention call on CPU. Each call pads to its own longest context, so sorting by length
# and cutting into batches copies less padding; past ~32 rows a bigger call saves little per-call
# overhead (measured: 8 -> 32 rows was +3-7% per workload). On a GPU one call for all decodes is
# cheaper than several kernel launches.
CPU_DECODE_BATCH = 32


class ModelRunner:
    def __init__(self, model, kv_pool, attention: str, block_size: int, device: torch.device):
        self.model = model
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
        """Pack the step. Decodes come first, sorted by context length, so every decode batch is one
        contiguous run of rows; prefill chunks follow. Logit rows are returned in `scheduled` order."""
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
                table = torch.tensor(seq.block_table[:num_blocks], device=self.device) if cached else None
                prefills.append(SeqSlice(q_start, n, start + n, table))
            last_row[i] = q_start + n - 1
        sample_rows = [last_row[i] for i, (seq, n) in enumerate(scheduled) if seq.num_computed_tokens + n == len(seq)]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slot_mapping, device=self.device) if cached else None,
            prefills=prefills,
            block_size=self.block_size,
        )
        self._prepare_decodes(meta, [scheduled[i][0] for i in decodes])
        ids = torch.tensor(input_ids, device=self.device)
        pos = torch.tensor(positions, device=self.device)
        return ids, pos, meta, sample_rows

    def _prepare_decodes(self, meta: AttentionMetadata, seqs: list[Sequence]) -> None:
        """`seqs` sorted by context length, cut into batches of `decode_batch`, each padded to its own
        longest; block tables and masks built once per step for all layers."""
        bs = self.block_size
        for start in range(0, len(seqs), self.decode_batch):
            batch = seqs[start : start + self.decode_batch]
            context_lens = torch.tensor([s.num_computed_tokens + 1 for s in batch], device=self.device)
            width = -(-(batch[-1].num_computed_tokens + 1) // bs)  # the longest is last
            tables = torch.tensor([(s.block_table + [0] * width)[:width] for s in batch], device=self.device)
            hidden = torch.arange(width * bs, device=self.device) >= context_lens[:, None]
            mask = torch.zeros(hidden.shape, dtype=self.kv_pool.dtype, device=self.device).masked_fill_(hidden, float("-inf"))
            meta.decodes.append(DecodeBatch(start, start + len(batch), tables, context_lens, mask.view(len(batch), 1, 1, -1)))

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]], copies: list[tuple[int, int]]) -> torch.Tensor:
        if copies:
            self.kv_pool.copy_blocks(copies)
        ids, pos, meta, sample_rows = self.prepare(scheduled)
        self.backend.meta = meta
        hidden = self.model(ids, pos, self.backend)
        self.num_forward_tokens += len(ids)
        return self.model.compute_logits(hidden[sample_rows]).float()
