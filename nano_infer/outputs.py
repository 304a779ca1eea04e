"""What `LLM.generate` returns: vLLM's RequestOutput / CompletionOutput shape."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestOutputKind(enum.Enum):
    """vLLM's SamplingParams.output_kind: what each output of a running request holds."""
    CUMULATIVE = 0  # everything so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when the request ends


@dataclass
class Logprob:
    logprob: float  # natural log of the token's probability in the model's raw distribution
    rank: int  # 1 for the most likely token
    decoded_token: str | None = None  # the token's text (vLLM's field)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None
    # with SamplingParams(logprobs=k): per token, the sampled token and the k most likely ones
    logprobs: list[dict[int, Logprob]] | None = None
    # the log-probability of token_ids given the prompt: with logprobs asked for (raw distribution), and in beam search
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (both tiers)
    num_preemptions: int = 0
    # the host tier (chapter 12), which keeps these figures and fills them in when an output is built: of
    # num_cached_tokens, those loaded back from it; KV blocks (and bytes) this request's sequences copied
    # host -> device (prefix loads, swap-ins) and device -> host (swap-outs)
    num_host_cached_tokens: int = 0
    kv_blocks_in: int = 0
    kv_blocks_out: int = 0
    kv_bytes_in: int = 0
    kv_bytes_out: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    # set when this request failed inside a step (the others in the step carry on); it is then finished
    error: Exception | None = None
    # with SamplingParams(prompt_logprobs=k): per prompt token, None for the first, then the token and the k
    # most likely given the tokens before it
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    @property
    def num_cached_tokens(self) -> int:
        return self.metrics.num_cached_tokens if self.metrics else 0
