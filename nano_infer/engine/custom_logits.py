"""Custom logits processors with vLLM's (v1) interface: `LLM(logits_processors=[MyProcessor])`.

vLLM's processors work on the whole batch at once and keep their own state per row of a "persistent
batch": a request keeps its row index from step to step, and before each step the processor is told what
changed (`update_state(BatchUpdate)`: rows removed, requests added at an index, rows moved), then edits the
step's logits in place of rows (`apply`). This engine's steps list their sampling sequences in scheduled
order, which changes as requests come and go, so `PersistentBatch` keeps that table: a new sequence takes
the lowest free row, a finished (or preempted) one frees its row, and the last rows move down into holes so
the batch stays dense. The step's logits are put into row order for the processors and back after.

What the processors see of a request: its SamplingParams (`extra_args` is where vLLM's examples carry their
per-request settings), its prompt ids, and its output ids as a live view that grows as it generates.
The logprobs a request asks for are the model's, before any processor (vLLM's default `raw_logprobs`).
Speculative decoding is refused with them, as vLLM does; beam search rows do not go through them.

The same names import from `nano_infer.v1.sample.logits_processor`, vLLM's path with `vllm` swapped.
"""
from __future__ import annotations

import importlib
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence as SequenceABC
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

import torch

from ..sampling_params import SamplingParams


class MoveDirectionality(Enum):
    UNIDIRECTIONAL = auto()  # the row at `a` moves to `b` (b's old content is gone)
    SWAP = auto()  # rows `a` and `b` trade places


@dataclass(frozen=True)
class BatchUpdate:
    """What changed since the last step, to apply in this order: removed, added, moved."""

    batch_size: int
    removed: list[int]  # row indices freed
    added: list[tuple[int, SamplingParams, list[int], SequenceABC[int]]]  # (row, params, prompt ids, output ids)
    moved: list[tuple[int, int, MoveDirectionality]]  # (from, to, how)


class LogitsProcessor(ABC):
    """vLLM's v1 interface; a subclass is passed as a class and built once per engine."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Raise ValueError for a request whose params this processor cannot take (checked when it is added)."""

    @abstractmethod
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool): ...

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The batch's logits [rows, vocab] in persistent-row order, changed (in place or as a new tensor)."""

    @abstractmethod
    def is_argmax_invariant(self) -> bool:
        """True when the processor never changes a row's largest entry (vLLM then skips it for greedy rows;
        here every processor runs on every row)."""

    @abstractmethod
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Called before every step's `apply`; None when the batch did not change."""


def process_dict_updates(state: dict, batch_update: BatchUpdate | None,
                         new_state: Callable[[SamplingParams, list[int], SequenceABC[int]], Any]) -> bool:
    """Keep a {row: per-request state} dict in step with the batch (vLLM's helper of the same name):
    `new_state(params, prompt ids, output ids)` for an added request (None: nothing kept for it). True if
    the dict changed."""
    if batch_update is None:
        return False
    changed = False
    for row in batch_update.removed:
        changed |= state.pop(row, None) is not None
    for row, params, prompt, output in batch_update.added:
        value = new_state(params, prompt, output)
        changed |= state.pop(row, None) is not None or value is not None
        if value is not None:
            state[row] = value
    for a, b, how in batch_update.moved:
        first, second = state.pop(a, None), state.pop(b, None)
        changed |= first is not None or second is not None
        if first is not None:
            state[b] = first
        if second is not None and how is MoveDirectionality.SWAP:
            state[a] = second
    return changed


class OutputIds(SequenceABC):
    """A sequence's generated ids as they grow, without copying them (vLLM hands processors a live list)."""

    def __init__(self, seq):
        self.tokens, self.start = seq.token_ids, seq.num_prompt_tokens

    def __len__(self) -> int:
        return len(self.tokens) - self.start

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tokens[self.start:][i]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.tokens[self.start + i % len(self)]  # one item, no copy: iterating stays linear


class PersistentBatch:
    """The processors of one engine and the row each sampling sequence holds in their batch."""

    def __init__(self, processors: list[LogitsProcessor]):
        self.processors = processors
        self.rows: list[int] = []  # row -> seq_id

    def validate(self, params: SamplingParams) -> None:
        for p in self.processors:
            type(p).validate_params(params)

    def __call__(self, logits: torch.Tensor, seqs: list) -> torch.Tensor:
        """logits [N, V] of `seqs` (scheduled order) after every processor, as a new tensor in the same order."""
        update = self._update(seqs)
        for p in self.processors:
            p.update_state(update)
        where = {seq_id: row for row, seq_id in enumerate(self.rows)}
        order = torch.tensor([where[s.seq_id] for s in seqs], dtype=torch.long, device=logits.device)
        batch = logits.new_empty((len(self.rows), logits.shape[1])).index_copy_(0, order, logits)
        for p in self.processors:
            batch = p.apply(batch)
        return batch.index_select(0, order)

    def _update(self, seqs: list) -> BatchUpdate | None:
        now = {s.seq_id for s in seqs}
        removed = [row for row, seq_id in enumerate(self.rows) if seq_id not in now]
        held = set(self.rows)
        free = list(removed)
        for row in removed:
            self.rows[row] = None
        added = []
        for seq in (s for s in seqs if s.seq_id not in held):
            row = free.pop(0) if free else len(self.rows)
            if row == len(self.rows):
                self.rows.append(None)
            self.rows[row] = seq.seq_id
            added.append((row, seq.params, seq.prompt_token_ids, OutputIds(seq)))
        moved = []
        while None in self.rows:  # the last rows move down into the holes left: the batch stays dense
            last, seq_id = len(self.rows) - 1, self.rows.pop()
            if seq_id is not None:
                hole = self.rows.index(None)
                self.rows[hole] = seq_id
                moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
        if not (removed or added or moved):
            return None
        return BatchUpdate(len(self.rows), removed, added, moved)


def resolve_processors(specs: list | None) -> list[type[LogitsProcessor]]:
    """The classes `logits_processors` names (LogitsProcessor subclasses, or "module.Class" / "module:Class"
    names of them): checked before the model loads, built once it has (`cls(config, device, False)`)."""
    return [_resolve(spec) for spec in specs or ()]


def _resolve(spec):
    if isinstance(spec, str):
        module, _, name = spec.replace(":", ".").rpartition(".")
        try:
            spec = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(f"logits_processors: {spec!r} names no class ({e})") from None
    if not (isinstance(spec, type) and issubclass(spec, LogitsProcessor)):
        raise ValueError(f"logits_processors: {spec!r} is not a subclass of LogitsProcessor "
                         f"(nano_infer.v1.sample.logits_processor.LogitsProcessor, vLLM's v1 interface)")
    return spec


def _register_vllm_paths() -> None:
    this = sys.modules[__name__]
    for path in ("nano_infer.v1", "nano_infer.v1.sample", "nano_infer.v1.sample.logits_processor",
                 "nano_infer.v1.sample.logits_processor.builtin", "nano_infer.v1.sample.logits_processor.interface"):
        sys.modules.setdefault(path, this)


_register_vllm_paths()
