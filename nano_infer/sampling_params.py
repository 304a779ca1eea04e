"""Per-request generation settings, with the names vLLM uses so scripts port unchanged."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


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
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # vLLM's cache_salt: requests share prefix-cache blocks only with requests of the same salt, so a
    # tenant can neither reuse nor time another's cached prompt (the server salts by API key)
    cache_salt: str | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        def bad(name, value, allowed):
            shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
            raise ValueError(f"SamplingParams.{name}={shown} is invalid: must be {allowed}")

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
        kinds = [k for k in ("regex", "json_schema", "choice") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"SamplingParams: give at most one of regex, json_schema, choice (got {kinds})")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            bad("choice", self.choice, "a non-empty list of non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def constrained(self) -> bool:
        return self.regex is not None or self.json_schema is not None or self.choice is not None
