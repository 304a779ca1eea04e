"""What the event loops send AsyncLLM's engine thread: one small dataclass per kind of message.

The two threads share nothing but the inbox, so each message names what it carries.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..constrained.token_index import TokenIndex
from ..sampling_params import SamplingParams
from .streams import Stream


@dataclass
class AddRequest:
    """generate() -> engine thread: a request prepared off the engine thread, to queue for admission."""

    stream: Stream  # where its outputs go; its request_id is the request's
    tenant: str | None
    priority: int
    prompt: str | None  # the text of a text prompt (RequestOutput.prompt), else None
    prompt_token_ids: list[int]
    params: SamplingParams
    stream_outputs: bool  # an output every step, or only the last (LLMEngine.add_request's `stream`)
    constraint_index: TokenIndex | None = None  # a constrained request's compiled token index


@dataclass
class AbortRequest:
    """generate() -> engine thread: its caller left early; drop the request, admitted or still waiting."""

    stream: Stream


@dataclass
class Shutdown:
    """shutdown() -> engine thread: stop taking messages and end the thread."""
