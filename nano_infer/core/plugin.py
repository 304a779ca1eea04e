"""EnginePlugin: a part beside the step loop, entered through narrow seams.

`LLMEngine.step` stays the same short loop whatever is switched on; a feature that needs more
than scheduling, one forward pass and sampling is a plug-in. There are five:

- `KVOffloader` (kv/offload.py, chapter 12) runs the host tier's block copies with the step's and
  times them and the prefills, for the swap-or-recompute cost model;
- `SpeculativeDecoder` (spec/, chapter 09) proposes before the pass (`adjust`) and verifies its
  own rows after it (`claims`, `process`);
- `BeamSearcher` (beam/, chapter 11) serves the requests with `BeamSearchParams`: it claims their
  rows, forks and frees beams;
- `StepRecorder` (engine/memory.py, the memory plots) records each finished step (`after_step`);
- `DenseCopies` (models/dense_copies.py, chapter 13) gives int4 weights a dense copy on the first
  step of a batch or of a long prompt.

A plug-in sees a `StepContext` and `Sequences`, never the engine or its tables. The engine runs the
plug-ins in the order of their `phase`, because two of them touch the same KV blocks before the pass:
the tier's copies must be in place before a draft model reads the blocks they fill.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import torch

from .batch import BlockSwap, ScheduledSeq, SchedulerOutput
from .request import Request
from .sequence import Sequence


class Phase(IntEnum):
    """When a plug-in's hooks run among the others'; the engine sorts its plug-ins by it."""

    MOVE_BLOCKS = 0  # adds block copies to the step's (the host tier's offloads and loads)
    PROPOSE = 1  # changes what entries compute, may read the KV pools first (speculation's draft)
    OBSERVE = 2  # sees the batch as the forward pass will run it


class StepRunner(Protocol):
    """What a step's plug-ins may ask of the model runner: run the step's block copies now."""

    def swap(self, moves: BlockSwap) -> None: ...


class Sequences(Protocol):
    """The engine's side of a step as a plug-in may change it: one sequence at a time, never the tables.
    The engine's output processor is the one implementation; a plug-in that rolls KV back (speculation)
    is given the KV manager itself."""

    eos_token_ids: set[int]

    def advance(self, seq: Sequence, num_computed_tokens: int) -> None:
        """The step computed `seq`'s K/V up to `num_computed_tokens` (before its tokens are appended)."""

    def append_token(self, seq: Sequence, token: int, now: float) -> None:
        """Append a token as the sampler would: metrics, constraint, text, stop checks (it may finish `seq`)."""

    def isolated(self, seq: Sequence, fn: Callable[..., None], *args) -> None:
        """Run `fn(*args)` for `seq`'s rows; if it raises, `seq`'s request fails alone."""

    def fork(self, seq: Sequence) -> Sequence:
        """A new sequence of the same request with `seq`'s tokens, on `seq`'s blocks, queued beside it."""

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` (its blocks go back to the pool, the full ones stay cached)."""

    def record_tokens(self, req: Request, num_tokens: int, now: float) -> None:
        """`req` produced `num_tokens` tokens at `now` without appending them one by one (a beam round)."""


@dataclass
class StepContext:
    """One engine step as the plug-ins see it: what they may read and change, not the engine."""

    batch: SchedulerOutput  # a plug-in may change what each scheduled entry computes
    runner: StepRunner  # runs the block copies when a plug-in moves them early
    moves: BlockSwap | None  # the step's block copies until they run, then None
    start: float  # when the step began (time.perf_counter)

    def move_blocks(self, out: list | tuple = (), into: list | tuple = ()) -> None:
        """Run the step's block copies now, with the host tier's `out` (device -> host) and `into`
        (host -> device), in BlockSwap's order; whatever no plug-in moved runs with the forward
        pass. Once a step: copies added after it are a plug-in in the wrong phase."""
        if self.moves is None:
            if out or into:
                raise RuntimeError("block copies added after the step's blocks were moved: a plug-in "
                                   "that adds copies must run in Phase.MOVE_BLOCKS, before any that reads them")
            return
        moves, self.moves = self.moves, None
        moves.out += out
        moves.into += into
        if moves:
            self.runner.swap(moves)


class EnginePlugin:
    """Every hook is optional. The engine asks `claims` only of plug-ins that define it."""

    phase = Phase.OBSERVE

    def lookahead(self, seq: Sequence) -> int:
        """KV slots the scheduler reserves past `seq`'s next token for this plug-in (speculation's proposals)."""
        return 0

    def adjust(self, step: StepContext) -> None:
        """Before the forward pass: change what the scheduled entries compute."""

    def claims(self, entry: ScheduledSeq) -> bool:
        """Does this plug-in turn `entry`'s logit rows into tokens, instead of the sampler?"""
        return False

    def process(self, claimed: list[tuple[ScheduledSeq, int]], logits: torch.Tensor, seqs: Sequences) -> None:
        """`claimed` is [(entry, first logit row)]: append their tokens through `seqs`."""

    def after_step(self, step: StepContext) -> None:
        """After outputs are processed and the caches committed."""
