"""Pack one scheduled step into tensors, run the model, return logits of the rows that sample.

For each scheduled sequence the step computes tokens [num_computed, num_computed + n):
their ids and positions go into the packed batch, their slots (where K/V is written) into
the slot mapping. A sequence samples a token only when the step reaches its last known
token; a prefill chunk in the middle of a prompt produces no logits.

Speculative decoding: a sequence's proposed tokens (`seq.spec_token_ids`) follow its known
tokens, and a verify step computes the last known token plus all proposals in one pass, with
a logit row for each (the target's distribution after every proposed prefix). Verify rows are
batched like decodes (several query tokens each), grouped by how many tokens they verify.
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
        self.draft = None  # spec.DraftProposer when a draft model proposes tokens

    def _slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare(self, scheduled: list[tuple[Sequence, int]], offset: int = 0):
        """Pack the step. Decodes (and verify rows) come first, grouped by query length and sorted by
        context length, so every decode batch is one contiguous run of rows; prefill chunks follow.
        Logit rows are returned in `scheduled` order: the last row of a sequence that reaches its
        last known token, every row of a verify. `offset` starts each sequence that many tokens
        past `num_computed_tokens` (a draft model's k-th proposal pass)."""
        cached = self.kv_pool is not None
        decodes = sorted((i for i, (seq, n) in enumerate(scheduled) if cached and (n == 1 or n == 1 + len(seq.spec_token_ids))),
                         key=lambda i: (scheduled[i][1], scheduled[i][0].num_computed_tokens))
        is_decode = set(decodes)
        input_ids, positions, slot_mapping, prefills, rows = [], [], [], [], {}
        for i in decodes + [i for i in range(len(scheduled)) if i not in is_decode]:
            seq, n = scheduled[i]
            start = seq.num_computed_tokens + offset
            known = seq.token_ids + seq.spec_token_ids if seq.spec_token_ids else seq.token_ids
            q_start = len(input_ids)
            input_ids += known[start : start + n]
            positions += range(start, start + n)
            if cached:
                slot_mapping += self._slots(seq, start, start + n)
            if i not in is_decode:
                num_blocks = -(-(start + n) // self.block_size)
                table = torch.tensor(seq.block_table[:num_blocks], device=self.device) if cached else None
                prefills.append(SeqSlice(q_start, n, start + n, table))
            if start + n == len(known):
                num_rows = min(n, 1 + len(seq.spec_token_ids))
                rows[i] = range(q_start + n - num_rows, q_start + n)
        logit_rows = [r for i in range(len(scheduled)) for r in rows.get(i, ())]
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slot_mapping, device=self.device) if cached else None,
            prefills=prefills,
            block_size=self.block_size,
        )
        self._prepare_decodes(meta, [scheduled[i] for i in decodes], offset)
        ids = torch.tensor(input_ids, device=self.device)
        pos = torch.tensor(positions, device=self.device)
        return ids, pos, meta, logit_rows

    def _prepare_decodes(self, meta: AttentionMetadata, scheduled: list[tuple[Sequence, int]], offset: int) -> None:
        """`scheduled` grouped by query length and sorted by context length, cut into batches of
        `decode_batch` rows of one query length, each padded to its own longest; block tables and
        masks built once per step for all layers."""
        bs, row, i = self.block_size, 0, 0
        while i < len(scheduled):
            q_len = scheduled[i][1]
            j = i
            while j < len(scheduled) and j - i < self.decode_batch and scheduled[j][1] == q_len:
                j += 1
            batch = [seq for seq, _ in scheduled[i:j]]
            context_lens = torch.tensor([s.num_computed_tokens + offset + q_len for s in batch], device=self.device)
            width = -(-(batch[-1].num_computed_tokens + offset + q_len) // bs)  # the longest is last
            tables = torch.tensor([(s.block_table + [0] * width)[:width] for s in batch], device=self.device)
            # query i of a row sits at position context_len - q_len + i and sees keys up to it
            q_pos = context_lens[:, None] - q_len + torch.arange(q_len, device=self.device)
            hidden = torch.arange(width * bs, device=self.device) > q_pos[:, :, None]
            mask = torch.zeros(hidden.shape, dtype=self.kv_pool.dtype, device=self.device).masked_fill_(hidden, float("-inf"))
            meta.decodes.append(DecodeBatch(row, row + len(batch) * q_len, tables, context_lens,
                                            mask.view(len(batch), 1, q_len, -1), q_len))
            row += len(batch) * q_len
            i = j

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write in every KV pool that is indexed by the block tables (the draft's too)."""
        if copies:
            self.kv_pool.copy_blocks(copies)
            if self.draft is not None:
                self.draft.kv_pool.copy_blocks(copies)

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Logits [rows, vocab] float32 for the rows `prepare` names, in scheduled order. A draft
        model runs the same packed step, so its KV pool holds K/V wherever the target's does."""
        ids, pos, meta, logit_rows = self.prepare(scheduled)
        self.backend.meta = meta
        hidden = self.model(ids, pos, self.backend)
        if self.draft is not None:
            self.draft.mirror(ids, pos, meta)
        self.num_forward_tokens += len(ids)
        return self.model.compute_logits(hidden[logit_rows]).float()
