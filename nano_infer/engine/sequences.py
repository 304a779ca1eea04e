"""How a request's sequences start: fresh from its prompt, or forked off a sequence of the same request
(n > 1 samples, a beam extended twice). The engine and the output processor both make them here."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.request import Request
from ..core.sequence import SamplingState, Sequence
from ..text.detokenizer import IncrementalDetokenizer
from .sampling import seeded_generator

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def new_sequence(req: Request, index: int, device: torch.device, tokenizer: PreTrainedTokenizerBase,
                 parent: Sequence | None = None) -> Sequence:
    """Sample `index` of `req`: fresh, or a fork carrying `parent`'s tokens so far (and its logprobs)."""
    params, state = req.params, SamplingState()
    if params.seed is not None:
        state.generator = seeded_generator(params.seed, index, device)
    if req.constraint is not None:
        source = req.constraint if parent is None else parent.sampling.constraint
        state.constraint = source if parent is None and index == 0 else source.fork()
    if params.logprobs is not None:
        inherited = parent.sampling if parent is not None else None
        state.logprobs = list(inherited.logprobs) if inherited and inherited.logprobs is not None else []
        state.cumulative_logprob = inherited.cumulative_logprob if inherited else None
    if params.prompt_logprobs is not None and index == 0:
        state.prompt_logprobs = [None]  # the first token has no context to be scored in
    if (req.stream or params.stop) and params.detokenize:  # text needed while running; else decoded once at the end
        state.detokenizer = IncrementalDetokenizer(tokenizer, params.skip_special_tokens)
    return Sequence(req.request_id, list(req.prompt_token_ids), params, index=index,
                    token_ids=list(parent.token_ids) if parent else [], sampling=state)
