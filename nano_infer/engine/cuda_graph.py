"""Decode steps replayed from CUDA graphs (vLLM's default; `enforce_eager=True` turns it off).

A decode step of a small model on a GPU is bound by launching kernels, not by running them:
hundreds of small kernels, each costing about as much CPU work to launch as it runs on the GPU
(chapter 13 times a captured step against an eager one). A CUDA graph records the
kernels of one step once and replays them all with one launch. A graph fixes every shape and
every address, so:

- the step's inputs are copied into static buffers, and the graph reads them there;
- one graph is captured per bucket: a batch size from `BATCH_BUCKETS` and a block-table width
  (a power of two of blocks), the first time a step needs it;
- a step is padded up to its bucket by repeating its first sequence (same token, position, slot
  and block table): the padding rows compute the same K/V as that sequence and write it to the
  same slot, so they change nothing, and their logits are dropped.

Only plain decode steps qualify: one token per sequence, no prefill chunk, no speculative verify,
no draft model beside the target, one process. Everything else runs eagerly. On a CPU there is no
graph to capture (and compiling the step cost more to build than it could ever win back),
so `capture=False` runs the same bucketed, padded step eagerly: what the CPU tests check.
"""
from __future__ import annotations

import torch

from ..models.attention import AttentionMetadata, DecodeBatch

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def batch_bucket(num_seqs: int) -> int | None:
    """The smallest captured batch size that holds `num_seqs` sequences (None past the largest)."""
    return next((b for b in BATCH_BUCKETS if b >= num_seqs), None)


def width_bucket(num_blocks: int, max_blocks: int) -> int:
    """Block-table width a step pads to: the next power of two, at most the longest a sequence can need."""
    return min(1 << max(num_blocks - 1, 0).bit_length(), max_blocks)


def plain_decode(step, max_seqs: int) -> bool:
    """A decode step a padded graph can run: one token per sequence, no prefill chunk, no verify, every row
    sampled, at most `max_seqs` sequences (an 8-bit pool's exact open blocks are read through per-step slots
    no graph holds)."""
    if step.prefills or len(step.decodes) != 1 or step.open_blocks is not None:
        return False
    _, _, lens, q_len = step.decodes[0]
    return q_len == 1 and len(lens) <= max_seqs and len(step.sample_rows) == len(lens)


def padded_inputs(step, batch: int, width: int) -> tuple[list[list[int]], torch.Tensor]:
    """The step's input ids, positions, slots and context lengths, and its block tables [batch, width], padded
    to `batch` rows with copies of the first sequence and to `width` with block 0, which the mask hides."""
    _, tables, lens, _ = step.decodes[0]
    pad = batch - len(lens)
    rows = [values + values[:1] * pad for values in (step.input_ids, step.positions, step.slot_mapping, lens)]
    table = torch.zeros(batch, width, dtype=torch.long)
    table[: len(lens), : len(tables[0])] = torch.tensor(tables)
    table[len(lens):] = table[0]
    return rows, table


def decode_mask(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1, 1, width * block_size] additive: -inf for a key past its sequence's query, computed inside the
    step from `context_lens`, so a replay (or a compiled call) recomputes it."""
    keys = torch.arange(block_tables.shape[1] * block_size, device=block_tables.device)
    hidden = keys[None, :] >= context_lens[:, None]  # a key past the query's position
    mask = torch.zeros(hidden.shape, dtype=dtype, device=block_tables.device)
    return mask.masked_fill_(hidden, float("-inf")).view(block_tables.shape[0], 1, 1, -1)


class DecodeGraphs:
    """Static buffers and one captured step per (batch bucket, width bucket)."""

    def __init__(self, model, backend, block_size: int, max_blocks: int, device: torch.device,
                 capture: bool | None = None):
        self.model, self.backend = model, backend
        self.block_size, self.max_blocks, self.device = block_size, max_blocks, device
        self.capture = device.type == "cuda" if capture is None else capture
        rows = BATCH_BUCKETS[-1]
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(rows, dtype=torch.long, device=device)
        self.context_lens = torch.ones(rows, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(rows * max_blocks, dtype=torch.long, device=device)  # [batch, width] in front
        self.steps: dict[tuple[int, int], tuple] = {}  # (batch, width) -> (graph or None, metadata, logits)
        self.pool = None  # one memory pool shared by every graph: they never run at once

    def eligible(self, step) -> bool:
        """A plain decode step (see the module doc) that fits the largest bucket."""
        return plain_decode(step, BATCH_BUCKETS[-1])

    @torch.inference_mode()
    def run(self, step) -> torch.Tensor:
        """Logits [rows, vocab] of an eligible step in `step.sample_rows` order (scheduled order; the rows
        are in context-length order), from its bucket's graph (captured on first use)."""
        _, tables, lens, _ = step.decodes[0]
        n = len(lens)
        batch, width = batch_bucket(n), width_bucket(len(tables[0]), self.max_blocks)
        self._fill(step, batch, width)
        key = (batch, width)
        if key not in self.steps:
            self.steps[key] = self._capture(batch, width)
        graph, meta, logits = self.steps[key]
        if graph is None:
            logits = self._forward(batch, meta)
        else:
            graph.replay()
        return logits[torch.tensor(step.sample_rows, device=self.device)]

    def _fill(self, step, batch: int, width: int) -> None:
        """The step's inputs into the static buffers, padded to `batch` rows with copies of the first."""
        rows, table = padded_inputs(step, batch, width)
        for buf, values in zip((self.input_ids, self.positions, self.slot_mapping, self.context_lens), rows):
            buf[:batch].copy_(torch.tensor(values), non_blocking=True)
        self._tables(batch, width).copy_(table, non_blocking=True)

    def _tables(self, batch: int, width: int) -> torch.Tensor:
        """The static block tables of a bucket, contiguous (the attention views them flat)."""
        return self.block_tables[: batch * width].view(batch, width)

    def _metadata(self, batch: int, width: int) -> AttentionMetadata:
        """Attention metadata over the static buffers; the mask is computed from `context_lens` inside the
        step, so a replay recomputes it."""
        decode = DecodeBatch(0, batch, self._tables(batch, width), self.context_lens[:batch], None)
        return AttentionMetadata(slot_mapping=self.slot_mapping[:batch], decodes=[decode], block_size=self.block_size)

    def _forward(self, batch: int, meta: AttentionMetadata) -> torch.Tensor:
        """One padded decode step on the static buffers: logits [batch, vocab] in float32."""
        decode = meta.decodes[0]
        decode.mask = decode_mask(decode.block_tables, decode.context_lens, self.block_size, self.backend.store.dtype)
        self.backend.meta = meta
        out = self.model(self.input_ids[:batch], self.positions[:batch], self.backend)
        return self.model.compute_logits(out).float()

    def _capture(self, batch: int, width: int) -> tuple:
        meta = self._metadata(batch, width)
        if not self.capture:
            return None, meta, None
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up outside the graph: lazy initialisation, autotuning
            self._forward(batch, meta)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(batch, meta)
        self.pool = graph.pool()
        return graph, meta, logits
