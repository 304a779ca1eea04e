"""Pack one scheduled step, run the model, return logits of the rows that sample.

For each scheduled sequence the step computes tokens [num_computed, num_computed + n):
their ids and positions go into the packed batch, their slots (where K/V is written) into
the slot mapping. A sequence samples a token only when the step reaches its last known
token; a prefill chunk in the middle of a prompt produces no logits, unless its request scores
the prompt (prompt logprobs): then each prompt position it computes has a row.

A step is packed in two stages: `pack` turns the scheduled sequences into a `StepInput` of
plain lists (what a tensor-parallel driver sends its workers), `build` turns that into the
tensors the model reads. Every rank runs `execute` on the same StepInput.

Speculative decoding: an entry's proposed tokens (`ScheduledSeq.spec_token_ids`) follow its
known tokens, and a verify step computes the last known token plus all proposals in one pass,
with a logit row for each (the target's distribution after every proposed prefix). Verify rows
are batched like decodes (several query tokens each), grouped by how many tokens they verify.

Other models can run on the same block tables (`mirror`): a draft model keeps its own KV pool
filled at the same slots by running every packed step too. The runner does not know what
they are for.
"""
from __future__ import annotations

from itertools import accumulate

import torch

from ..models.attention import AttentionMetadata, DecodeBatch, SeqSlice, make_backend
from ..kv.block_manager import slot_mapping
from ..core.batch import BlockSwap, ScheduledSeq, StepInput, StepOpenBlocks
from ..kv.offload import HostKVPool
from ..kv.open_blocks import NoOpenBlocks, open_block_visible
from .compiled_decode import CompiledDecode
from .cuda_graph import DecodeGraphs

# Decodes per attention call on CPU. Each call pads to its own longest context, so sorting by length
# and cutting into batches copies less padding; a bigger call saves per-call overhead, which matters
# less and less past a few dozen rows (`make bench-ab` measures a change to it). On a GPU one call for
# all decodes is cheaper than several kernel launches.
CPU_DECODE_BATCH = 32


class ModelRunner:
    def __init__(self, model, kv_pool, attention: str, block_size: int, device: torch.device, executor=None):
        self.model = model
        self.executor = executor  # nano_infer.distributed.TPExecutor on a tensor-parallel driver
        self.kv_pool = kv_pool
        self.block_size = block_size
        self.device = device
        self.backend = make_backend("dense" if kv_pool is None else attention, kv_pool.store if kv_pool else None)
        self.decode_batch = CPU_DECODE_BATCH if device.type == "cpu" else 1 << 16
        self.num_forward_tokens = 0  # tokens pushed through the model so far (prefill work done)
        self.mirrors: list[tuple] = []  # (model, kv_pool, backend) run on every step at the same slots
        self.host_pools: list[HostKVPool] = []  # the host tier of each KV pool (chapter 12)
        # captured decode steps (CUDA) or compiled ones (a CPU), unless enforce_eager
        self.graphs: DecodeGraphs | CompiledDecode | None = None
        self.open_blocks = NoOpenBlocks()  # an 8-bit pool's exact open blocks: the block manager's rows

    def capture_decode(self, max_model_len: int, capture: bool | None = None) -> None:
        """Replay plain decode steps from CUDA graphs, one per batch-size and table-width bucket (see
        `cuda_graph.py`); `capture=False` runs the same padded steps eagerly (on a CPU)."""
        self.graphs = DecodeGraphs(self.model, self.backend, self.block_size, -(-max_model_len // self.block_size),
                                   self.device, capture)

    def mirror(self, model, kv_pool, attention: str):
        """Run `model` on every packed step too, writing its K/V into `kv_pool` at the slots the
        target's block tables name (so copy-on-write, rollback and the host tier apply to both).
        Returns its backend."""
        backend = make_backend(attention, kv_pool.store)
        self.mirrors.append((model, kv_pool, backend))
        if self.host_pools:
            self.host_pools.append(HostKVPool(kv_pool, self.host_pools[0].tensor.shape[2]))
        return backend

    def attach_host_tier(self, num_blocks: int) -> None:
        """A host pool of `num_blocks` blocks beside the KV pool (and beside each mirror's)."""
        self.host_pools = [HostKVPool(pool, num_blocks) for pool in (self.kv_pool, *(m[1] for m in self.mirrors))]

    def swap(self, swap: BlockSwap) -> None:
        """The step's block copies ahead of its forward pass, for a plug-in that reads the pools first, on
        every tensor-parallel rank (each holds its own host tier)."""
        if self.executor is not None:
            self.executor.run(swap, self.apply_swap)
        else:
            self.apply_swap(swap)

    @torch.inference_mode()
    def apply_swap(self, swap: BlockSwap) -> None:
        """Out to the host tier, copy-on-write, back in: the order `BlockSwap` explains. The one place
        any block is copied, whether a plug-in moves the step's blocks early or the forward pass does."""
        for host in self.host_pools:
            host.copy_out(swap.out)
        self.copy_blocks(swap.copies)
        if swap.open_block_copies:
            for pool in (self.kv_pool, *(m[1] for m in self.mirrors)):
                pool.copy_open_rows(swap.open_block_copies)
        for host in self.host_pools:
            host.copy_in(swap.into)

    def prepare(self, scheduled: list[ScheduledSeq]):
        """(ids, positions, AttentionMetadata, logit rows) of the step: `build(pack(scheduled))`."""
        step = self.pack(scheduled)
        ids, pos, meta = self.build(step)
        return ids, pos, meta, step.sample_rows

    def pack(self, scheduled: list[ScheduledSeq], moves: BlockSwap | None = None) -> StepInput:
        """Decodes (and verify rows) come first, grouped by query length and sorted by context length,
        so every decode batch is one contiguous run of rows; prefill chunks follow. Logit rows are
        listed in `scheduled` order: each entry's last `num_logit_rows` (the row that samples, every
        row of a verify, the prompt rows of a prompt being scored)."""
        cached, bs = self.kv_pool is not None, self.block_size
        decodes = sorted((i for i, e in enumerate(scheduled) if cached and e.is_decode),
                         key=lambda i: (scheduled[i].num_tokens, scheduled[i].start))
        is_decode = set(decodes)
        opened = self.open_blocks if cached and self.open_blocks.ring else None
        step_open = StepOpenBlocks([], [], [], []) if opened is not None else None
        decode_open = []  # per decode entry, in `decodes` order: its open-block slots
        input_ids, positions, slots, prefills, rows = [], [], [], [], {}
        for i in decodes + [i for i in range(len(scheduled)) if i not in is_decode]:
            e = scheduled[i]
            start, end, q_start, num_rows = e.start, e.end, len(input_ids), e.num_logit_rows
            input_ids += e.token_ids
            positions += range(start, end)
            if cached:
                slots += slot_mapping(e.seq.block_table, start, end, bs)
            if i not in is_decode:
                prefills.append((q_start, e.num_tokens, end, e.seq.block_table[: e.num_blocks(bs)] if cached else None))
            if opened is not None:
                first = start - start % bs  # the first query's block, exact from its start
                # kept for later steps: a decode's tokens (a verify may roll back into its first block), a
                # chunk's in the block it ends in (none when it ends on a boundary)
                keep = start if i in is_decode else max(start, end - end % bs)
                step_open.write_rows += range(q_start + keep - start, q_start + e.num_tokens)
                step_open.write_slots += opened.slots(e.seq, keep, end)
                if i in is_decode:
                    decode_open.append(opened.slots(e.seq, first, first + (1 if e.num_tokens == 1 else 2) * bs))
                else:
                    step_open.prefill_slots.append(opened.slots(e.seq, first, start))
            if num_rows:
                rows[i] = range(q_start + e.num_tokens - num_rows, q_start + e.num_tokens)
        sample_rows = [r for i in range(len(scheduled)) for r in rows.get(i, ())]
        batches = self._decode_batches([scheduled[i] for i in decodes])
        if opened is not None:
            ends = accumulate(len(lens) for _, _, lens, _ in batches)
            step_open.decode_slots = [decode_open[end - len(b[2]) : end] for b, end in zip(batches, ends)]
        return StepInput(input_ids, positions, slots if cached else None, prefills, batches, sample_rows, moves,
                         step_open)

    def _decode_batches(self, scheduled: list[ScheduledSeq]) -> list:
        """`scheduled` (grouped by query length, sorted by context length) cut into batches of at most
        `decode_batch` rows of one query length, each padded to its own longest."""
        batches, row, i = [], 0, 0
        while i < len(scheduled):
            q_len = scheduled[i].num_tokens
            j = i
            while j < len(scheduled) and j - i < self.decode_batch and scheduled[j].num_tokens == q_len:
                j += 1
            batch = scheduled[i:j]
            width = batch[-1].num_blocks(self.block_size)  # the longest is last
            batches.append((row, [(e.seq.block_table + [0] * width)[:width] for e in batch], [e.end for e in batch], q_len))
            row += len(batch) * q_len
            i = j
        return batches
    def build(self, step: StepInput):
        """(ids, positions, AttentionMetadata) on this rank's device; decode block tables and masks are
        built once per step for all layers."""
        dev, bs = self.device, self.block_size
        opened = step.open_blocks
        meta = AttentionMetadata(
            slot_mapping=None if step.slot_mapping is None else torch.tensor(step.slot_mapping, device=dev),
            prefills=[SeqSlice(q_start, q_len, context_len, None if table is None else torch.tensor(table, device=dev))
                      for q_start, q_len, context_len, table in step.prefills],
            block_size=bs,
        )
        if opened is not None:
            meta.open_write = tuple(torch.tensor(x, dtype=torch.long, device=dev)
                                    for x in (opened.write_rows, opened.write_slots))
            for s, open_slots in zip(meta.prefills, opened.prefill_slots):
                s.open_slots = torch.tensor(open_slots, dtype=torch.long, device=dev)
        for j, (start, tables, lens, q_len) in enumerate(step.decodes):
            context_lens = torch.tensor(lens, device=dev)
            tables = torch.tensor(tables, device=dev)
            # query i of a row sits at position context_len - q_len + i and sees keys up to it
            q_pos = context_lens[:, None] - q_len + torch.arange(q_len, device=dev)
            key_pos = torch.arange(tables.shape[1] * bs, device=dev)
            open_slots = None
            if opened is None:
                hidden = key_pos > q_pos[:, :, None]
            else:  # then the exact copies of the blocks the queries sit in, after the pool's keys
                open_slots = torch.tensor(opened.decode_slots[j], dtype=torch.long, device=dev)
                open_pos = q_pos[:, :1] // bs * bs + torch.arange(open_slots.shape[1], device=dev)
                hidden = ~open_block_visible(q_pos[:, :, None], key_pos[None, None], open_pos[:, None], bs)
            mask = torch.zeros(hidden.shape, dtype=self.kv_pool.dtype, device=dev).masked_fill_(hidden, float("-inf"))
            meta.decodes.append(DecodeBatch(start, start + len(lens) * q_len, tables, context_lens,
                                            mask.view(len(lens), 1, q_len, -1), q_len, open_slots))
        return torch.tensor(step.input_ids, device=dev), torch.tensor(step.positions, device=dev), meta

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write in every KV pool that is indexed by the block tables (the mirrors' too)."""
        if copies:
            self.kv_pool.copy_blocks(copies)
            for _, pool, _ in self.mirrors:
                pool.copy_blocks(copies)

    @torch.inference_mode()
    def run(self, scheduled: list[ScheduledSeq], moves: BlockSwap | None = None) -> torch.Tensor:
        """Logits [rows, vocab] in float32 for the rows `pack` names, in scheduled order, after the block
        copies `moves`. With tensor parallelism the executor first sends the step to every worker, which
        runs `execute` on it in lockstep."""
        step = self.pack(scheduled, moves)
        if self.executor is not None:
            return self.executor.run(step, self.execute)
        return self.execute(step)

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor | None:
        """Block copies, forward, logits of the listed rows (None on a tensor-parallel worker). The
        mirrors run the same packed step, so their KV pools hold K/V wherever the target's does."""
        if step.moves is not None:
            self.apply_swap(step.moves)
        if self.graphs is not None and not self.mirrors and self.graphs.eligible(step):
            self.num_forward_tokens += len(step.input_ids)
            return self.graphs.run(step)
        ids, pos, meta = self.build(step)
        self.backend.meta = meta
        hidden = self.model(ids, pos, self.backend)
        for model, _, backend in self.mirrors:
            backend.meta = meta
            model(ids, pos, backend)
        self.num_forward_tokens += len(ids)
        logits = self.model.compute_logits(hidden[step.sample_rows])
        return None if logits is None else logits.float()
