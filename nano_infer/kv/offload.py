"""The host tier's memory and its copies (chapter 12); `HostTier` keeps the books, this moves the bytes.

`HostKVPool` is a second pool laid out like the device pool, block by block: on CUDA in pinned
host memory (page-locked, so the copy engine can read and write it while the GPU computes); on a
CPU in ordinary memory, committed page by page as blocks are first written. On a CPU the "two
tiers" are two regions of the same RAM: what the lesson shows there is the mechanism and the
cost model, not a saving of scarce memory.

Each direction of a step's copies is one batched call pair: `index_select` gathers the listed
blocks into one contiguous tensor, `index_copy_` scatters it into the other pool. On CUDA they run
on a side stream: the host-to-device copy overlaps the CPU's packing of the step, and the compute
stream waits for it (an event, not a host sync) before the forward pass reads the blocks.

`KVOffloader` is the engine plug-in: before each forward pass it takes the copies the
`HostTier` queued and runs them with the step's copy-on-write, ahead of any plug-in that reads
the blocks (its phase, `Phase.MOVE_BLOCKS`), and after each step it feeds the measured copy
bandwidth and prefill throughput to the `CostModel` that decides swap or recompute.
"""
from __future__ import annotations

import time

import torch

from ..core.plugin import EnginePlugin, Phase, StepContext
from .cost import CostModel
from .host_tier import HostTier
from .paged import KVPool, lazy_zeros


class HostKVPool:
    """The host blocks for one device pool: [layers, 2, num_blocks, block_size, kv_heads, head_dim], and for a
    quantized pool (chapter 14) its scales [layers, 2, num_blocks, block_size, kv_heads] beside them: a block
    stays quantized on the host, so the same host memory holds as many more tokens as the device pool does."""

    def __init__(self, pool: KVPool, num_blocks: int):
        self.tensor_pairs = []  # (the device pool's tensor seen block by block, its host copy)
        for device_tensor in pool.tensors:
            layers, two, _, *per_slot = device_tensor.shape
            self.tensor_pairs.append((device_tensor.view(layers, two, pool.num_blocks, pool.block_size, *per_slot),
                               _host_tensor((layers, two, num_blocks, pool.block_size, *per_slot), device_tensor)))
        self.device_blocks, self.tensor = self.tensor_pairs[0]
        self.stream = torch.cuda.Stream(pool.tensor.device) if pool.tensor.device.type == "cuda" else None

    @property
    def nbytes(self) -> int:
        return sum(host.numel() * host.element_size() for _, host in self.tensor_pairs)

    def copy_out(self, pairs: list[tuple[int, int]]) -> None:
        """(device block, host block) pairs; returns once the bytes are in host memory."""
        for device_blocks, host in self.tensor_pairs:
            self._on_side_stream(device_blocks, host, pairs)

    def copy_in(self, pairs: list[tuple[int, int]]) -> None:
        """(host block, device block) pairs; on CUDA the forward pass waits for them, the CPU does not."""
        for device_blocks, host in self.tensor_pairs:
            self._on_side_stream(host, device_blocks, pairs)

    def _on_side_stream(self, src: torch.Tensor, dst: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        if self.stream is None:
            _copy(src, dst, pairs)
            return
        compute = torch.cuda.current_stream(self.device_blocks.device)
        self.stream.wait_stream(compute)  # after the kernels that wrote (or still read) these blocks
        with torch.cuda.stream(self.stream):
            _copy(src, dst, pairs)
        compute.wait_stream(self.stream)  # before the kernels that read (or overwrite) them


def _host_tensor(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Pinned on CUDA (so the copy engine moves it while the GPU computes), else committed page by page."""
    if like.device.type == "cuda":
        return torch.empty(shape, dtype=like.dtype, pin_memory=True)
    return lazy_zeros(shape, like.dtype)


def _copy(src: torch.Tensor, dst: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """Blocks src[i] -> dst[j] for each (i, j): one gather, one transfer, one scatter."""
    src_idx = torch.tensor([i for i, _ in pairs], device=src.device)
    dst_idx = torch.tensor([j for _, j in pairs], device=dst.device)
    gathered = src.index_select(2, src_idx)
    if dst.device.type == "cuda" and gathered.device.type == "cpu":
        gathered = gathered.pin_memory().to(dst.device, non_blocking=True)  # async on the current (side) stream
    elif gathered.device != dst.device:
        gathered = gathered.to(dst.device)  # device -> host waits for the gather: the CPU scatter reads it next
    dst.index_copy_(2, dst_idx, gathered)


class KVOffloader(EnginePlugin):
    """Runs the tiers' copies before each forward pass and measures what they and prefills cost."""

    phase = Phase.MOVE_BLOCKS

    def __init__(self, tier: HostTier, cost: CostModel):
        self.tier = tier
        self.cost = cost
        self.bytes_out = 0  # device -> host, ever
        self.bytes_in = 0  # host -> device, ever

    def adjust(self, step: StepContext) -> None:
        """The tier's copies, with the step's copy-on-write between them, run now and timed."""
        out, into = self.tier.take_transfers()
        if not out and not into:
            return
        start = time.perf_counter()
        step.move_blocks(out, into)
        nbytes = (len(out) + len(into)) * self.cost.bytes_per_block
        self.cost.observe_copy(nbytes, time.perf_counter() - start)
        self.bytes_out += len(out) * self.cost.bytes_per_block
        self.bytes_in += len(into) * self.cost.bytes_per_block

    def after_step(self, step: StepContext) -> None:
        """A step that was mostly prompt tokens measures the recompute rate."""
        batch = step.batch
        prefill = sum(e.num_tokens for e in batch.scheduled if e.kind == "prefill")
        if prefill and 2 * prefill >= batch.num_batched_tokens:
            self.cost.observe_prefill(batch.num_batched_tokens, time.perf_counter() - step.start)
