"""A request and its sequences: what `LLMEngine.add_request` builds and the output side reads.

A request of n samples is n sequences. On a paged cache the first one is admitted alone and
the others fork off it once its prompt is computed (`Sequence.num_pending_forks`), so the prompt's
blocks are computed once and shared. Beam search's requests are the same record: their sequences
are the live beams, and the beams' scores are the beam searcher's own state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..outputs import RequestMetrics
from ..sampling_params import SamplingParams
from .sequence import Sequence

if TYPE_CHECKING:  # annotation only
    from ..constrained.constraint import Constraint


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    metrics: RequestMetrics
    stream: bool = False
    error: Exception | None = None  # what failed it inside a step
    constraint: Constraint | None = None  # the first sequence's constraint; each fork gets its own copy

    @property
    def pending_forks(self) -> int:
        return sum(s.num_pending_forks for s in self.seqs)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs) and not self.pending_forks
