"""Decode steps of a few sequences through torch's own compiler, on a CPU (`enforce_eager=True` turns it off).

A CPU decode step of one chat spends much of its time between the matmuls: each layer runs dozens of small
torch ops (two norms, the rotary embedding, the residual adds, SiLU-and-mul, the KV write and gather, the
mask), each dispatched from Python and each a pass over memory. `torch.compile` (inductor) traces the whole
step once, fuses the small ops into a few C++ loops and calls the int4 matmul and attention kernels directly
(chapter 13 times the compiled step beside the eager one).

Shapes: one graph per batch bucket (1, 2 or 4 sequences, a step padded up to its bucket by repeating its
first sequence, as the CUDA graphs of `cuda_graph.py` pad theirs) with the block-table width left dynamic,
so a bucket compiles once per process, and inductor's cache on disk turns a later process's compile into
a load. A table of one block is padded to two (a dynamic size of 1 would be specialised: a second graph).
An engine that serves batches can ask for larger buckets (vLLM's `compilation_config={"compile_sizes":
[...]}`): past a few sequences the matmuls set a step's time, but the small ops and the Python around them
still take a share, for a compile per bucket. A bucket of more than `INT4_MAX_ROWS` sequences is traced
with the dense copies a batch gives 4-bit layers (`DenseCopies`), so `warm_up` has them made first.

The numbers are the eager step's, nearly always to the bit: compiled with `emulate_precision_casts`, the
bfloat16 roundings happen where the eager code has them, and a rare step rounds one value the other way (the
tests compare the two steps' logits, and float32 tokens with transformers').

The one piece not traced as written is the KV write: in a graph, `index_copy_` into a view of the pool
becomes a copy of the layer's whole pool with the new rows in it, copied back after the step (right, and
a pass over the whole pool per layer per step). `write_kv`, an op of its own that declares what it mutates,
keeps the write in place.
"""
from __future__ import annotations

import logging
import os
import shutil
import sysconfig
import time
import types

import torch

from ..kv.store import LayerKV
from ..models.attention import AttentionMetadata, DecodeBatch, GatherAttention
from ..models.dense_copies import hold_dense_copies
from ..models.quantization import INT4_MAX_ROWS
from .cuda_graph import decode_mask, padded_inputs, plain_decode

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4)  # the default: few sequences, where a step's small ops weigh most beside its matmuls
ENV = "NANO_INFER_COMPILE"  # "0": every engine of the process decodes eagerly unless it asks (the test suite)


# An op of the dispatcher's own with a Python kernel: torch.library.custom_op's wrapper costs several times
# the two index_copy_ calls at every call, and a step makes one a layer
_LIB = torch.library.Library("nano_infer", "FRAGMENT")
_LIB.define("write_kv(Tensor(a!) k_slots, Tensor(b!) v_slots, Tensor slot_mapping, Tensor k, Tensor v) -> ()")


def _write_kv(k_slots: torch.Tensor, v_slots: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
    """The step's K and V into their slots, in place."""
    k_slots.index_copy_(0, slot_mapping, k)
    v_slots.index_copy_(0, slot_mapping, v)


_LIB.impl("write_kv", _write_kv, "CPU")
torch.library.register_fake("nano_infer::write_kv", lambda *args: None, lib=_LIB)
write_kv = torch.ops.nano_infer.write_kv


class InPlaceLayerKV(LayerKV):
    """A layer's K/V whose write stays an in-place write inside a compiled graph, and whose blocks are read as
    [num_blocks, block_size, KVH * D]: with a block's slots a dimension of their own, inductor's gather loop copies
    each slot's K (or V) as one contiguous run of vector loads, where through LayerKV's 2-D view of the blocks it
    computes every element's address apart (a modulo each) and copies element by element."""

    @classmethod
    def of(cls, layer: LayerKV, block_size: int) -> InPlaceLayerKV:
        k_blocks = layer.k_slots.view(-1, block_size, layer.k_slots.shape[1:].numel())
        return cls(layer.k_slots, layer.v_slots, k_blocks, layer.v_slots.view(k_blocks.shape))

    def write(self, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        write_kv(self.k_slots, self.v_slots, slot_mapping, k, v)
        return k, v


def wants_compiled_decode(enforce_eager: bool | None, device: torch.device, model) -> bool:
    """`enforce_eager=False` asks for it (on a CPU); None, the default, means yes on a CPU for weights held in
    4 or 8 bits (a GGUF file as stored, or quantized at load: the one-chat race with llama.cpp, where the
    small ops weigh most) unless the environment says NANO_INFER_COMPILE=0; True never. Float32 and plain
    bfloat16 weights stay eager by default: a compile costs tens of seconds, which a notebook's short runs
    never win back."""
    if device.type != "cpu" or enforce_eager:
        return False
    if enforce_eager is False:
        return True
    return getattr(model, "quantization", "none") != "none" and os.environ.get(ENV, "1") != "0"


def cxx_compiler() -> str | None:
    """The path of the C++ compiler inductor would call, or None when there is none, or no Python headers for
    the modules it builds with it."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    if not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return None
    try:
        return shutil.which(get_cpp_compiler())
    except RuntimeError:  # inductor found none to name
        return None


_ARGUMENTS = frozenset(("input_ids", "positions", "slot_mapping", "block_tables", "context_lens"))  # _forward's


def _guards_to_keep(guards) -> list[bool]:
    """Dynamo's guards on the step's own arguments and their sizes, none on what it reads through `self`: the
    model's weights and the KV pool never change after the engine is built, and checking hundreds of them before
    every step costs a share of it; the thread count (the free-core plug-in changes it between steps, and the
    compiled loops take theirs from OpenMP at run time) and the modules' attributes (the dense copies an int4
    layer gains for steps of more rows than a compiled step has) would each recompile the step for nothing."""
    return [g.guard_type == "SHAPE_ENV" or g.name in _ARGUMENTS for g in guards]


OPTIONS = {
    "emulate_precision_casts": True,  # bfloat16 rounded where the eager step rounds it
    "guard_filter_fn": _guards_to_keep,
    # the generated Python checks each extern kernel's output size, stride and alignment after the call: hundreds
    # of calls a step, on shapes the compile fixed
    "size_asserts": False,
    "alignment_asserts": False,
    # the step's hundreds of kernel and op calls made from C++, where the Python wrapper pays an interpreter's
    # line and an op lookup for each (and torch's int4 op reads its group size back out of a tensor); it costs a
    # longer first compile, which inductor's cache keeps
    "cpp_wrapper": True,
}


class CompiledDecode:
    """One compiled decode step per batch bucket, built on first use (`warm_up` builds them ahead)."""

    def __init__(self, model, store, block_size: int, dtype: torch.dtype, batch_sizes: tuple[int, ...] | None = None):
        self.model, self.block_size, self.dtype = model, block_size, dtype
        self.batch_sizes = batch_sizes or BATCH_BUCKETS  # sorted
        self.backend = GatherAttention(store)  # with views of its own: the in-place write
        self.backend._views = block_size, [InPlaceLayerKV.of(layer, block_size) for layer in store.layers(block_size)]
        self.threads = torch.get_num_threads()  # the most the engine runs on: the compile sees them all
        # a code object of its own: dynamo keeps compiled graphs per code object, and the guards leave out all this
        # step reads through `self`, so two engines of one process would otherwise run one engine's graph
        forward = types.FunctionType(CompiledDecode._forward.__code__.replace(), globals(), "_forward")
        self.step = torch.compile(types.MethodType(forward, self), fullgraph=True, dynamic=False,
                                  options=dict(OPTIONS))  # a copy: torch.compile takes guard_filter_fn out of it
        self.compile_seconds: dict[int, float] = {}  # batch bucket -> seconds its first call took (its compile)

    def eligible(self, step) -> bool:
        """A plain decode step (cuda_graph.py's rule) of at most the largest bucket's sequences."""
        return plain_decode(step, self.batch_sizes[-1])

    @torch.inference_mode()
    def run(self, step) -> torch.Tensor:
        """Logits [rows, vocab] in float32 of an eligible step, in `step.sample_rows` order."""
        _, tables, lens, _ = step.decodes[0]
        batch = next(b for b in self.batch_sizes if b >= len(lens))
        rows, table = padded_inputs(step, batch, max(len(tables[0]), 2))
        ids, positions, slots, context_lens = (torch.tensor(values) for values in rows)
        logits = self._call(ids, positions, slots, table, context_lens)
        return logits[torch.tensor(step.sample_rows)]

    def warm_up(self) -> None:
        """Compile every bucket now, on a step that writes into block 0's first slot (call it before any
        request holds blocks): what a server does before it reports healthy."""
        if self.batch_sizes[-1] > INT4_MAX_ROWS:
            hold_dense_copies(self.model)
        with torch.inference_mode():
            for batch in self.batch_sizes:  # tensors of their own: inputs that alias each other would be guarded on
                ids, positions, slots = (torch.zeros(batch, dtype=torch.long) for _ in range(3))
                table, context_lens = torch.zeros(batch, 2, dtype=torch.long), torch.ones(batch, dtype=torch.long)
                self._call(ids, positions, slots, table, context_lens)

    def _call(self, input_ids, positions, slot_mapping, block_tables, context_lens) -> torch.Tensor:
        batch = len(input_ids)
        torch._dynamo.mark_dynamic(block_tables, 1)  # one graph for every width
        if batch in self.compile_seconds:
            return self.step(input_ids, positions, slot_mapping, block_tables, context_lens)
        threads, start = torch.get_num_threads(), time.perf_counter()
        torch.set_num_threads(self.threads)  # code for every thread; it runs on as many as are set at the time
        try:
            out = self.step(input_ids, positions, slot_mapping, block_tables, context_lens)
        finally:
            torch.set_num_threads(threads)
        self.compile_seconds[batch] = time.perf_counter() - start
        logger.info("compiled the CPU decode step for %d sequence%s in %.1f s (inductor's cache on disk keeps it)",
                    batch, "s" if batch > 1 else "", self.compile_seconds[batch])
        return out

    def _forward(self, input_ids, positions, slot_mapping, block_tables, context_lens) -> torch.Tensor:
        """One padded decode step: logits [batch, vocab] in float32. The mask comes from `context_lens`."""
        mask = decode_mask(block_tables, context_lens, self.block_size, self.dtype)
        decode = DecodeBatch(0, len(input_ids), block_tables, context_lens, mask)
        self.backend.meta = AttentionMetadata(slot_mapping=slot_mapping, block_size=self.block_size, decodes=[decode])
        logits = self.model.compute_logits(self.model(input_ids, positions, self.backend)).float()
        # left set, the metadata would be rebuilt in Python after every call (dynamo replays what a graph leaves behind)
        self.backend.meta = None
        return logits
