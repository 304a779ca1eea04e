"""What `LLM.beam_search` takes and returns, with vLLM's names (`BeamSearchParams`, `BeamSearchOutput`).

BeamSearchParams lives in nano_infer.sampling_params, where vLLM's scripts import it from."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..sampling_params import BeamSearchParams

__all__ = ["BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence"]


@dataclass
class BeamSearchSequence:
    """One returned hypothesis. `tokens` is prompt + output, as vLLM returns it; `score` is the
    length-penalised cum_logprob the hypotheses are ranked by."""

    tokens: list[int]
    text: str
    cum_logprob: float
    score: float
    finish_reason: str  # "stop": it ended with EOS; "length": max_tokens (or the model's length) ended it
    num_prompt_tokens: int = 0

    @property
    def output_tokens(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens :]


@dataclass
class BeamSearchOutput:
    """The `beam_width` best hypotheses of one prompt, best first."""

    sequences: list[BeamSearchSequence] = field(default_factory=list)
