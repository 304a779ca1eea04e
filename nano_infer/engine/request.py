"""A request and its sequences: what `LLMEngine.add_request` builds and the output side reads.

A request of n samples is n sequences. On a paged cache the first one is admitted alone and
the others fork off it once its prompt is computed (`num_pending_forks`), so the prompt's
blocks are computed once and shared.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..text.detokenizer import IncrementalDetokenizer
from ..outputs import RequestMetrics
from .sampling import seeded_generator
from ..sampling_params import SamplingParams
from .sequence import Sequence


def check_utf8(text: str, what: str) -> None:
    """JSON can carry a lone surrogate ("\\ud800"), which is not a character and cannot be tokenized."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} contains {text[e.start:e.end]!r} at character {e.start}: a lone UTF-16 surrogate, "
                         f"not a character") from None


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
    constraint: object = None  # the first sequence's constraint; each fork gets its own copy
    beam: object = None  # beam search: the request's BeamState (its sequences are the live beams)

    @property
    def pending_forks(self) -> int:
        return sum(s.num_pending_forks for s in self.seqs)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs) and not self.pending_forks

    def new_sequence(self, index: int, device, tokenizer, parent: Sequence | None = None) -> Sequence:
        """Sample `index` of this request: fresh, or a fork carrying `parent`'s tokens so far."""
        params = self.params
        seq = Sequence(self.request_id, list(self.prompt_token_ids), params, index=index,
                       token_ids=list(parent.token_ids) if parent else [])
        if params.seed is not None:
            seq.generator = seeded_generator(params.seed, index, device)
        if self.constraint is not None:
            source = self.constraint if parent is None else parent.constraint
            seq.constraint = source if parent is None and index == 0 else source.fork()
        if params.logprobs is not None:
            seq.logprobs = list(parent.logprobs) if parent is not None and parent.logprobs is not None else []
            seq.cumulative_logprob = parent.cumulative_logprob if parent is not None else None
        if params.prompt_logprobs is not None and index == 0:
            seq.prompt_logprobs = [None]  # the first token has no context to be scored in
        if self.stream or params.stop:  # text is needed while running; otherwise decode once at the end
            seq.detokenizer = IncrementalDetokenizer(tokenizer, params.skip_special_tokens)
        return seq
