"""The benchmark workload and the numbers every engine is judged by.

A workload is a list of requests that all arrive at t=0, each with its own prompt length
and its own output length (`ignore_eos`, so every engine generates exactly the same
number of tokens). Prompts are random token ids drawn from the tokenizer's ordinary
tokens with a fixed seed: throughput does not depend on what the tokens say, only on how
many there are.

Every engine runner hands back, for each request, the wall-clock time of each output
token (seconds after t=0). `summarize` turns those into the reported figures, so all
engines are measured by the same code.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field


@dataclass
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int


@dataclass
class Workload:
    name: str
    requests: list[BenchRequest]
    seed: int

    @property
    def num_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.requests)


def make_workload(num_requests: int, token_ids: list[int], seed: int = 0, round: int = 0,
                  prompt_len: tuple[int, int] = (16, 192), output_len: tuple[int, int] = (32, 96)) -> Workload:
    """`num_requests` requests with prompt and output lengths uniform in the given (inclusive) ranges.

    The lengths depend only on `seed`; the prompt tokens also on `round`, so each round of
    a benchmark does the same work on fresh prompts and no engine gets prefix-cache hits
    from the round before.
    """
    lengths = random.Random(seed)
    shape = [(lengths.randint(*prompt_len), lengths.randint(*output_len)) for _ in range(num_requests)]
    tokens = random.Random(f"{seed}/{round}")
    requests = [BenchRequest([tokens.choice(token_ids) for _ in range(p)], m) for p, m in shape]
    return Workload(f"{num_requests} requests", requests, seed)


def ordinary_token_ids(tokenizer) -> list[int]:
    """Every id of the vocabulary except special tokens (a random EOS or chat marker would be odd input)."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass
class RunResult:
    """One engine, one workload, one round."""

    engine: str
    wall_s: float  # t=0 to the last token
    output_tokens: int
    ttft_s: list[float]  # per request
    itl_s: list[float]  # every gap between consecutive output tokens of a request
    cpu_s: float  # CPU time the process used (all threads): steadier than wall time when others load the machine
    kv_reserved_bytes: int | None = None  # KV memory set aside (the pool, or the padded cache at its peak)
    kv_used_bytes: int | None = None  # peak bytes holding a real token's K/V
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    def summary(self) -> dict:
        return {
            "engine": self.engine,
            "output_tokens": self.output_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "cpu_s": self.cpu_s,
            "tokens_per_cpu_s": self.output_tokens / self.cpu_s,
            "ttft_p50_ms": 1e3 * percentile(self.ttft_s, 50),
            "ttft_p99_ms": 1e3 * percentile(self.ttft_s, 99),
            "itl_p50_ms": 1e3 * percentile(self.itl_s, 50),
            "itl_p99_ms": 1e3 * percentile(self.itl_s, 99),
            "itl_mean_ms": 1e3 * statistics.fmean(self.itl_s) if self.itl_s else float("nan"),
            "kv_reserved_mb": None if self.kv_reserved_bytes is None else self.kv_reserved_bytes / 2**20,
            "kv_used_mb": None if self.kv_used_bytes is None else self.kv_used_bytes / 2**20,
            **self.extra,
        }


def result_from_token_times(engine: str, token_times: list[list[float]], workload: Workload, **kw) -> RunResult:
    """Build a RunResult from per-request output-token times (seconds after t=0), checking the counts."""
    for times, req in zip(token_times, workload.requests):
        if len(times) != req.max_tokens:
            raise RuntimeError(f"{engine}: a request asked for {req.max_tokens} tokens and got {len(times)}")
    return RunResult(
        engine=engine,
        wall_s=max(t[-1] for t in token_times),
        output_tokens=sum(len(t) for t in token_times),
        ttft_s=[t[0] for t in token_times],
        itl_s=[b - a for t in token_times for a, b in zip(t, t[1:])],
        **kw,
    )
