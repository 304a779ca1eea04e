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
# and cutting into small batches copies far less padding, and each batch's gathered K/V stays in
# cache. On a GPU one call for all decodes is cheaper than several kernel launches.
CPU_DECODE_BATCH = 8


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
        input_ids, positions, slot_mapping, prefills, sample_rows = [], [], [], [], []
        decode_rows, decode_seqs = [], []
        cached = self.kv_pool is not None
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            q_start = len(input_ids)
            input_ids += seq.token_ids[start : start + n]
            positions += range(start, start + n)
            if cached:
                slot_mapping += self._slots(seq, start, start + n)
            if n == 1 and cached:
                decode_rows.append(q_start)
                decode_seqs.append(seq)
            else:
                key_slots = torch.tensor(self._slots(seq, 0, start + n), device=self.device) if cached else None
                prefills.append(SeqSlice(q_start, n, start + n, key_slots))
            if start + n == len(seq):
                sample_rows.append(q_start + n - 1)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slot_mapping, device=self.device) if cached else None,
            prefills=prefills,
            block_size=self.block_size,
        )
        if decode_rows:
            self._prepare_decodes(meta, decode_rows, decode_seqs)
        ids = torch.tensor(input_ids, device=self.device)
        pos = torch.tensor(positions, device=self.device)
        return ids, pos, meta, sample_rows

    def _prepare_decodes(self, meta: AttentionMetadata, rows: list[int], seqs: list[Sequence]) -> None:
        """Decodes sorted by context length, in batches of `decode_batch`, each padded to its own longest;
        block tables and masks built once per step for all layers."""
        bs = self.block_size
        order = sorted(range(len(seqs)), key=lambda i: seqs[i].num_computed_tokens)
        for start in range(0, len(order), self.decode_batch):
            batch = [seqs[i] for i in order[start : start + self.decode_batch]]
            context_lens = [s.num_computed_tokens + 1 for s in batch]
            max_blocks = max(len(s.block_table) for s in batch)
            tables = torch.tensor([s.block_table + [0] * (max_blocks - len(s.block_table)) for s in batch], device=self.device)
            S = max(context_lens)
            slots = (tables.unsqueeze(-1) * bs + torch.arange(bs, device=self.device)).view(len(batch), -1)[:, :S]
            lens = torch.tensor(context_lens, device=self.device)
            mask = (torch.arange(S, device=self.device).unsqueeze(0) < lens.unsqueeze(1)).view(len(batch), 1, 1, S)
            batch_rows = torch.tensor([rows[i] for i in order[start : start + self.decode_batch]], device=self.device)
            meta.decodes.append(DecodeBatch(batch_rows, slots.contiguous(), mask))

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]], copies: list[tuple[int, int]]) -> torch.Tensor:
        if copies:
            self.kv_pool.copy_blocks(copies)
        ids, pos, meta, sample_rows = self.prepare(scheduled)
        self.backend.meta = meta
        hidden = self.model(ids, pos, self.backend)
        self.num_forward_tokens += len(ids)
        return self.model.compute_logits(hidden[sample_rows]).float()
