"""One sequence being generated: its tokens, how many have K/V computed, and where the K/V lives."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

from ..sampling_params import SamplingParams

_seq_counter = itertools.count()


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0  # which of the request's n samples this is
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    token_ids: list[int] = field(default_factory=list)  # prompt + generated so far
    num_computed_tokens: int = 0  # tokens whose K/V is in the cache: set at admission, advanced by the scheduler
    num_cached_tokens: int = 0  # of the prompt, served by the prefix cache at admission
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generator: object = None  # torch.Generator when params.seed is set
    constraint: object = None  # nano_infer.constrained constraint, when the output is constrained
    detokenizer: object = None  # IncrementalDetokenizer, created when text is needed while running
    logprobs: list | None = None  # per output token {token id: Logprob}, when params.logprobs is set
    # per prompt token {token id: Logprob} (None for the first), filled as the prefill computes the prompt, when
    # params.prompt_logprobs is set; only the first sample of a request scores the prompt
    prompt_logprobs: list | None = None
    # chained hashes of its full blocks of tokens (prefix/hashing.py), computed once per block: the keys the
    # hash prefix cache and the host tier index blocks by
    block_hashes: list[int] = field(default_factory=list)
    # the prefix cache's own record of this sequence, opaque to everyone else: the radix tree's
    # locked node, or how many of its full blocks it has offered the hash cache
    prefix_handle: object = None
    num_preemptions: int = 0
    # n > 1 on a paged cache: samples that fork off this sequence once its prompt is computed
    # (they share its blocks); the scheduler keeps a seat for each from admission on
    num_pending_forks: int = 0
    # the sum of its output tokens' logprobs: kept as they are sampled when params.logprobs is set; beam search sets it
    # on a finished hypothesis
    cumulative_logprob: float | None = None

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
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
