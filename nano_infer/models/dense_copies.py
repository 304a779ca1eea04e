"""DenseCopies: int4 weights get a dense copy once the engine runs a batch or a long prompt (chapter 13).

A GGUF file held as stored runs torch's int4 kernel, which wins at one sequence (it reads a
third of the bytes) and loses from 8 rows up (it re-reads the weights every 4 rows). The first
step with more than `INT4_MAX_ROWS` sequences in it, or with a prompt chunk of more than
`LONG_PROMPT_ROWS` tokens, dequantizes every int4 layer once and keeps both forms: from then on
steps of many rows (a batch, a prompt) use the dense matmul and steps of few rows the int4 one.
A chat of short prompts never pays the copy's memory; a batch runs the same dense matmuls as with
the file dequantized at load.
"""
from __future__ import annotations

import logging
import time

import torch

from .quantization import INT4_MAX_ROWS, Int4Linear
from ..core.plugin import EnginePlugin, StepContext

logger = logging.getLogger("nano_infer")
# Up to this many prompt tokens a chat keeps only the 4-bit weights in memory. Past it the copies pay for themselves
# in the chunk's own step: the int4 kernel re-reads its weights every 4 rows, so a chunk this long costs more through
# it than making the copies and running it dense (chapter 13 times a prompt both ways; `adjust` logs the copies' cost).
LONG_PROMPT_ROWS = 1024


class DenseCopies(EnginePlugin):
    def __init__(self, layers: list[Int4Linear]):
        self.layers = layers  # the int4 layers to copy at the first step of many rows (warm_up may have copied them)

    @staticmethod
    def for_model(model) -> DenseCopies | None:
        """The plug-in for a model with int4 layers in bfloat16 (None otherwise: in float32 the int4 kernel is a
        scalar loop, and reading a weight back through it, K rows of an identity matrix, costs more than it saves)."""
        layers = _copyable(model)
        return DenseCopies(layers) if layers else None

    def adjust(self, step: StepContext) -> None:
        if not self.layers:
            return
        scheduled = step.batch.scheduled
        if len(scheduled) > INT4_MAX_ROWS:
            why = f"a step of more than {INT4_MAX_ROWS} sequences"
        elif max(e.num_tokens for e in scheduled) > LONG_PROMPT_ROWS:
            why = f"a prompt chunk of more than {LONG_PROMPT_ROWS} tokens"
        else:
            return
        _hold(self.layers, why)
        self.layers = []


def hold_dense_copies(model) -> None:
    """Give the model's int4 layers their dense copies now, not at the first step of many rows: a compiled decode
    step for more than INT4_MAX_ROWS sequences is traced with them (engine/compiled_decode.py)."""
    _hold(_copyable(model), f"decode steps of more than {INT4_MAX_ROWS} sequences compiled")


def _copyable(model) -> list[Int4Linear]:
    return [m for m in model.modules() if isinstance(m, Int4Linear) and m.scales_and_zeros.dtype == torch.bfloat16]


def _hold(layers: list[Int4Linear], why: str) -> None:
    layers = [layer for layer in layers if layer.dense is None]  # a layer holds one copy, made once
    if not layers:
        return
    start = time.perf_counter()
    copied = sum(layer.hold_dense_copy() for layer in layers)
    logger.info(f"{why}: the {len(layers)} int4 layers now also hold a dense copy for steps of many rows "
                f"(+{copied / 2**20:.0f} MiB in {time.perf_counter() - start:.2f} s)")
