"""Per-request generation settings, with the names vLLM uses so scripts port unchanged: SamplingParams, and
BeamSearchParams for `LLM.beam_search` (chapter 11)."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from .constrained.params import CONSTRAINT_FIELDS, GuidedDecodingParams, StructuredOutputsParams
from .constrained.token_rules import MAX_TOKEN_RULES, TokenRules, build_token_rules  # noqa: F401 (the server caps by it)
from .outputs import RequestOutputKind

# Below this temperature, sampling is greedy (as in vLLM): dividing logits by 1e-300 would
# overflow to inf and turn the softmax into NaN.
SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20  # alternatives per token, OpenAI's limit for top_logprobs
MAX_STOP_STRINGS = 32
MAX_STOP_LENGTH = 1024  # characters per stop string
# each generated token is looked up in stop_token_ids on the engine thread: 700k ids made a step seconds long
MAX_STOP_TOKEN_IDS = 256
MAX_CACHE_SALT = 256  # characters
MAX_TOP_K = 2**31 - 1
SEED_RANGE = (-(2**63), 2**63 - 1)  # a 64-bit integer, what torch.Generator.manual_seed takes
MAX_PENALTY = 2.0  # presence and frequency penalties: OpenAI's range is [-2, 2]
MAX_BAD_WORDS = 256


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _refuse(name: str, value, allowed: str):
    shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
    raise ValueError(f"SamplingParams.{name}={shown} is invalid: must be {allowed}")


@dataclass
class SamplingParams:
    """How to pick tokens for one request.

    `temperature=0` is greedy (so is any temperature below 1e-5). `seed` makes sampled
    output reproducible per request, independent of what else is in the batch. `n` asks for several samples of one
    prompt; they share the prompt's KV blocks (fork) when the cache is paged.
    `regex`, `json_schema` and `choice` constrain the output (chapter 07). `logprobs=k`
    returns, at each step, the sampled token's log-probability and those of the k most
    likely tokens, in the model's raw distribution (before temperature, top-k/top-p and
    constraints). `prompt_logprobs=k` returns, for every prompt token but the first, its
    log-probability given the tokens before it and the k most likely there
    (`RequestOutput.prompt_logprobs`): what scoring a text (lm-eval's log-likelihood) reads.

    The logits rules have vLLM's meaning (engine/logits_processors.py applies them, batched):
    `repetition_penalty` divides the positive logits (multiplies the negative ones) of every token
    already in the prompt or output, as transformers does; `presence_penalty` / `frequency_penalty`
    subtract, over output tokens only, a constant for a token that appeared / its count (OpenAI's
    definition); `min_tokens` forbids EOS and `stop_token_ids` (and ends no stop string) before that many
    tokens; `logit_bias` adds to given token ids; `bad_words` forbids each word's last token where the
    output already ends with the rest of it (with and without a leading space); `allowed_token_ids`
    forbids every other token; `min_p` drops tokens less likely than min_p times the top one.
    """

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int | None = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    regex: str | None = None
    json_schema: dict | str | Any | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # GBNF or Lark, through llguidance (vLLM's StructuredOutputsParams.grammar)
    structural_tag: str | dict | None = None  # vLLM's: JSON {"structures": [...], "triggers": [...]}
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # vLLM's cache_salt: requests share prefix-cache blocks only with requests of the same salt, so a
    # tenant can neither reuse nor time another's cached prompt (the server salts by API key)
    cache_salt: str | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    # vLLM's way to ask for regex / json_schema / choice (and the older guided_decoding): mapped onto them
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: GuidedDecodingParams | None = None
    # vLLM's: best_of only == n; output_kind (AsyncLLM.generate reads it; LLM.generate returns final outputs);
    # detokenize=False: token ids and empty text; extra_args: carried along, read by nothing here
    best_of: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    detokenize: bool = True
    extra_args: dict[str, Any] | None = None
    # logit_bias and allowed_token_ids as tensors, made by validate(); a field, so that dataclasses.replace
    # (the server's copy with the tenant's cache_salt) hands them on rather than making them again
    token_rules: TokenRules | None = field(default=None, repr=False, compare=False)
    # bad_words as token id sequences, set by the engine on its own copy of the params (it has the tokenizer)
    bad_words_token_ids: list[list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._map_structured_outputs()
        self.validate()

    def _map_structured_outputs(self) -> None:
        asked = [k for k in ("structured_outputs", "guided_decoding") if getattr(self, k) is not None]
        if not asked:
            return
        so = getattr(self, asked[0])
        if not isinstance(so, StructuredOutputsParams):
            raise ValueError(f"SamplingParams.{asked[0]} must be a StructuredOutputsParams, got {type(so).__name__}")
        mapped = so.constraint()  # a copy (dataclasses.replace) carries the mapped field already: no clash
        given = [k for k in CONSTRAINT_FIELDS if getattr(self, k) is not None and
                 getattr(self, k) != mapped.get(k)]
        if len(asked) > 1 or given:
            raise ValueError(f"SamplingParams: give one constraint, got {asked + given}")
        for name, value in mapped.items():
            setattr(self, name, value)

    def validate(self) -> None:
        bad = _refuse
        if not _is_int(self.n) or self.n < 1:
            bad("n", self.n, "an integer >= 1")
        if not _is_real(self.temperature) or self.temperature < 0:
            bad("temperature", self.temperature, "a finite number >= 0 (0 means greedy)")
        if not _is_int(self.top_k) or not -1 <= self.top_k <= MAX_TOP_K:
            bad("top_k", self.top_k, f"-1 or 0 (disabled) or an integer in [1, {MAX_TOP_K}] (beyond the vocabulary "
                                     f"size it keeps every token)")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "in the range (0, 1]")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens <= 0):
            bad("max_tokens", self.max_tokens, "an integer >= 1 (or None: up to the model length)")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            bad("seed", self.seed, f"None or a 64-bit integer, in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")
        if len(self.stop) > MAX_STOP_STRINGS:
            bad("stop", f"<{len(self.stop)} strings>", f"at most {MAX_STOP_STRINGS} strings")
        if not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LENGTH for s in self.stop):
            bad("stop", self.stop, f"a list of non-empty strings of at most {MAX_STOP_LENGTH} characters")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            bad("stop_token_ids", f"<{len(self.stop_token_ids)} ids>", f"at most {MAX_STOP_TOKEN_IDS} token ids")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", self.stop_token_ids, "a list of token ids >= 0")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            bad("logprobs", self.logprobs, f"None or an integer in [0, {MAX_LOGPROBS}]")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs)
                                                 or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            bad("prompt_logprobs", self.prompt_logprobs, f"None or an integer in [0, {MAX_LOGPROBS}]")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str)
                                            or not 0 < len(self.cache_salt) <= MAX_CACHE_SALT):
            bad("cache_salt", self.cache_salt, f"None or a non-empty string of at most {MAX_CACHE_SALT} characters")
        self._validate_logits_rules(bad)
        self._validate_vllm_fields(bad)
        kinds = [k for k in CONSTRAINT_FIELDS if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"SamplingParams: give at most one of {', '.join(CONSTRAINT_FIELDS)} (got {kinds})")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            bad("choice", self.choice, "a non-empty list of non-empty strings")

    def _validate_logits_rules(self, bad) -> None:
        if not _is_real(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad("repetition_penalty", self.repetition_penalty, "a finite number > 0 (1 is off)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_real(getattr(self, name)) or not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                bad(name, getattr(self, name), f"a number in [-{MAX_PENALTY}, {MAX_PENALTY}] (0 is off)")
        if not _is_real(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", self.min_p, "in the range [0, 1] (0 is off)")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", self.min_tokens, "an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", self.min_tokens, f"at most max_tokens={self.max_tokens}")
        self.compact_token_rules()
        if self.bad_words is not None and (
                not isinstance(self.bad_words, list) or len(self.bad_words) > MAX_BAD_WORDS
                or not all(isinstance(w, str) and w.strip() and len(w) <= MAX_STOP_LENGTH for w in self.bad_words)):
            bad("bad_words", self.bad_words, f"a list of at most {MAX_BAD_WORDS} non-blank strings of at most "
                                             f"{MAX_STOP_LENGTH} characters")
        if not isinstance(self.include_stop_str_in_output, bool):
            bad("include_stop_str_in_output", self.include_stop_str_in_output, "True or False")

    def _validate_vllm_fields(self, bad) -> None:
        if self.best_of is not None and self.best_of != self.n:
            bad("best_of", self.best_of, f"None or equal to n={self.n}: vLLM's best_of > n samples best_of and returns "
                                         f"the n most likely, which this engine does not do; ask for n={self.best_of}")
        if not isinstance(self.output_kind, RequestOutputKind):
            bad("output_kind", self.output_kind, "a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY)")
        if self.detokenize is not True and (self.detokenize is not False or self.stop):
            bad("detokenize", self.detokenize, "True or False, and True with stop strings (searched for in the text)")

    @classmethod
    def from_optional(cls, **kwargs) -> SamplingParams:
        """vLLM's constructor where None means "the default" for every argument (as an API request's absent fields)."""
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's): changing the copy's lists or dicts leaves this one as it is."""
        return copy.deepcopy(self)

    def compact_token_rules(self) -> TokenRules:
        """logit_bias and allowed_token_ids as TokenRules, made again only where a field was reassigned since."""
        rules = self.token_rules
        if rules is None or rules.sources[0] is not self.logit_bias or rules.sources[1] is not self.allowed_token_ids:
            self.token_rules = build_token_rules(self.logit_bias, self.allowed_token_ids, _refuse)
            self.logit_bias = self.token_rules.sources[0]
        return self.token_rules

    @property
    def adjusts_logits(self) -> bool:
        """Whether a logits rule (penalties, min_tokens, logit_bias, bad_words, allowed_token_ids) is on."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.min_tokens > 0 or bool(self.logit_bias) or bool(self.bad_words)
                or self.allowed_token_ids is not None)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def constrained(self) -> bool:
        return any(getattr(self, k) is not None for k in CONSTRAINT_FIELDS)


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
