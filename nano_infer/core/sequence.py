"""One sequence being generated: its tokens, how many have K/V computed, and where the K/V lives.

A `Sequence` holds what every step reads: ids, tokens, the block table, `num_computed_tokens`, status
and parameters. How its next token is drawn and what drawing produced besides token ids (a seeded
generator, a constraint, text, logprobs) is the output side's, in `SamplingState`. What a feature keeps
per sequence stays with the feature, keyed by `seq_id`: the prefix cache its handles and block hashes,
beam search its beams, the host tier what it swapped out.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import torch

from ..outputs import Logprob
from ..sampling_params import SamplingParams

if TYPE_CHECKING:  # annotations only: the constraint and the detokenizer are built by the engine
    from ..constrained.constraint import Constraint
    from ..text.detokenizer import IncrementalDetokenizer

_seq_counter = itertools.count()


class SequenceStatus(Enum):
    """Where a sequence is; a finished one also says why (the output's `finish_reason`)."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # an EOS or stop token, a stop string, a complete constrained output
    FINISHED_LENGTH = "length"  # max_tokens or max_model_len
    FINISHED_ABORTED = "abort"  # aborted by the caller, or failed alone (RequestOutput.error)
    FINISHED_PRUNED = "pruned"  # a beam no hypothesis extended

    @classmethod
    def finished(cls, reason: str) -> SequenceStatus:
        status = cls(reason)
        if status in (cls.WAITING, cls.RUNNING):
            raise ValueError(f"{reason!r} is not a finish reason")
        return status


@dataclass
class SamplingState:
    """How the sequence's tokens are drawn and what drawing produced besides their ids.

    The engine makes it with the sequence; the sampler and the logits processors read it, the output
    processor writes it. The scheduler and the KV memory never touch it.
    """

    generator: torch.Generator | None = None  # when params.seed is set
    constraint: Constraint | None = None  # when the output is constrained (regex, JSON Schema, choice, grammar)
    detokenizer: IncrementalDetokenizer | None = None  # when text is needed while running (streaming, stop strings)
    logprobs: list[dict[int, Logprob]] | None = None  # per output token, when params.logprobs is set
    # per prompt token (None for the first), filled as the prefill computes the prompt, when params.prompt_logprobs
    # is set; only the first sample of a request scores the prompt
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # the sum of its output tokens' logprobs: kept as they are sampled when params.logprobs is set; beam search sets
    # it on a finished hypothesis
    cumulative_logprob: float | None = None
    stop_reason: int | str | None = None  # the stop token or stop string that ended it


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0  # which of the request's n samples (or beams) this is
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    token_ids: list[int] = field(default_factory=list)  # prompt + generated so far
    num_computed_tokens: int = 0  # tokens whose K/V is in the cache: set at admission, advanced by the scheduler
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_preemptions: int = 0
    # n > 1 on a paged cache: samples that fork off this sequence once its prompt is computed
    # (they share its blocks); the scheduler keeps a seat for each from admission on
    num_pending_forks: int = 0
    sampling: SamplingState = field(default_factory=SamplingState)

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def scores_prompt(self) -> bool:
        """Prompt logprobs asked for and not all computed yet: every prompt position must be computed."""
        scored = self.sampling.prompt_logprobs
        return scored is not None and len(scored) < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status not in (SequenceStatus.WAITING, SequenceStatus.RUNNING)

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.is_finished else None
