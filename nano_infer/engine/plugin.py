"""EnginePlugin: a part beside the step loop, entered through narrow seams.

`LLMEngine.step` stays the same short loop whatever is switched on; a feature that needs more
than scheduling, one forward pass and sampling is a plug-in. There are five:

- `KVOffloader` (kv/offload.py, chapter 12) runs the host tier's block copies with the step's and
  times them and the prefills, for the swap-or-recompute cost model;
- `SpeculativeDecoder` (spec/, chapter 09) proposes before the pass (`adjust`) and verifies its
  own rows after it (`claims`, `process`);
- `BeamSearcher` (beam/, chapter 11) claims its beams' rows, forks and frees beams; the engine
  makes it on the first beam-search request;
- `StepRecorder` (engine/memory.py, the memory plots) records each finished step (`after_step`).
- `DenseCopies` (engine/dense_copies.py, chapter 13) gives int4 weights a dense copy on the first
  step of a batch or of a long prompt.

A plug-in sees a `StepContext`, never the engine. The engine runs the plug-ins in the order of
their `phase`, because two of them touch the same KV blocks before the pass: the tier's copies
must be in place before a draft model reads the blocks they fill.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Phase(IntEnum):
    """When a plug-in's hooks run among the others'; the engine sorts its plug-ins by it."""

    MOVE_BLOCKS = 0  # adds block copies to the step's (the host tier's offloads and loads)
    PROPOSE = 1  # changes what entries compute, may read the KV pools first (speculation's draft)
    OBSERVE = 2  # sees the batch as the forward pass will run it


@dataclass
class StepContext:
    """One engine step as the plug-ins see it: what they may read and change, not the engine."""

    batch: object  # the SchedulerOutput: a plug-in may change what each scheduled entry computes
    runner: object  # the ModelRunner: runs other models on the same block tables (a draft)
    moves: object | None  # the step's block copies (a BlockSwap) until they run, then None
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
        if moves.out or moves.copies or moves.into:
            self.runner.swap(moves)


class EnginePlugin:
    """Every hook is optional. The engine asks `claims` only of plug-ins that define it."""

    phase = Phase.OBSERVE

    def adjust(self, step: StepContext) -> None:
        """Before the forward pass: change what the scheduled entries compute."""

    def claims(self, entry) -> bool:
        """Does this plug-in turn `entry`'s logit rows into tokens, instead of the sampler?"""
        return False

    def process(self, claimed: list, logits, outputs) -> None:
        """`claimed` is [(entry, first logit row)]: append their tokens through `outputs`
        (an OutputProcessor; `outputs.isolated` ends a request that raises alone)."""

    def after_step(self, step: StepContext) -> None:
        """After outputs are processed and the caches committed."""
