"""Per-request generation settings, with the names vLLM uses so scripts port unchanged."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SamplingParams:
    """How to pick tokens for one request.

    `temperature=0` is greedy. `seed` makes sampled output reproducible per request,
    independent of what else is in the batch. `n` asks for several samples of one
    prompt; they share the prompt's KV blocks (fork) when the cache is paged.
    `regex`, `json_schema` and `choice` constrain the output (stage 07).
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

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        def bad(name, value, allowed):
            raise ValueError(f"SamplingParams.{name}={value!r} is invalid: must be {allowed}")

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", self.n, "an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            bad("temperature", self.temperature, ">= 0 (0 means greedy)")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            bad("top_k", self.top_k, "-1 (disabled) or an integer >= 1")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "in the range (0, 1]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens <= 0):
            bad("max_tokens", self.max_tokens, "an integer >= 1 (or None: up to the model length)")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", self.seed, "an integer or None")
        if not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", self.stop, "a list of non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", self.stop_token_ids, "a list of token ids >= 0")
        kinds = [k for k in ("regex", "json_schema", "choice") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"SamplingParams: give at most one of regex, json_schema, choice (got {kinds})")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            bad("choice", self.choice, "a non-empty list of non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def constrained(self) -> bool:
        return self.regex is not None or self.json_schema is not None or self.choice is not None
