"""What `LLM.beam_search` takes and returns, with vLLM's names (`BeamSearchParams`, `BeamSearchOutput`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..sampling_params import SAMPLING_EPS, SamplingParams, _is_int, _is_real

# length ** length_penalty stays a finite, non-zero float for every length up to 2**20 (2000 overflowed: a 500)
MAX_LENGTH_PENALTY = 50


@dataclass
class BeamSearchParams:
    """Keep the `beam_width` most likely continuations at every step; return the `beam_width` best finished ones.

    The rules are transformers' (`generate(num_beams=k, do_sample=False)`): a finished hypothesis
    scores cum_logprob / generated_tokens ** length_penalty (1.0 divides by the length, 0 ranks by
    raw log-probability, above 1 favours longer outputs); `early_stopping` is when the search may
    stop before `max_tokens`: True as soon as beam_width hypotheses are finished, False (the default)
    when the best running beam, scored at its current length, cannot beat the worst finished one,
    "never" when it could not even at `max_tokens` (with length_penalty > 0; the canonical search).
    `temperature` > 0 scores log_softmax(logits / temperature) instead of the raw distribution;
    the search stays deterministic either way.
    """

    beam_width: int
    max_tokens: int | None  # None: up to the model's length
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    early_stopping: bool | str = False
    cache_salt: str | None = None  # as SamplingParams.cache_salt: prefix blocks shared only within a salt

    def __post_init__(self):
        def bad(name, allowed):
            raise ValueError(f"BeamSearchParams.{name}={getattr(self, name)!r} is invalid: must be {allowed}")

        if not _is_int(self.beam_width) or self.beam_width < 1:
            bad("beam_width", "an integer >= 1")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            bad("max_tokens", "an integer >= 1 (or None: up to the model's length)")
        if not _is_real(self.temperature) or self.temperature < 0:
            bad("temperature", "a finite number >= 0 (0 scores the raw distribution)")
        if not _is_real(self.length_penalty) or abs(self.length_penalty) > MAX_LENGTH_PENALTY:
            bad("length_penalty", f"a number in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}] (1.0 divides by the "
                                  f"length, 0 turns the penalty off)")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            bad("early_stopping", "True, False or 'never'")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "True or False")

    def sampling_params(self) -> SamplingParams:
        """What every beam of the request carries as a sequence: its length limit and what ends it."""
        return SamplingParams(n=self.beam_width, temperature=0.0, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                              cache_salt=self.cache_salt)

    # what the server and AsyncLLM read of any request's params, as they read SamplingParams
    @property
    def n(self) -> int:
        return self.beam_width

    stop = ()
    logprobs = None
    constrained = False

    @property
    def scale(self) -> float | None:
        """The temperature the logits are divided by, or None for the raw distribution."""
        return self.temperature if self.temperature >= SAMPLING_EPS else None


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
