"""Where one request's outputs travel to its consumer: a mailbox on the consumer's loop, read as deltas.

`Stream` is a one-item mailbox rather than a queue: outputs are cumulative, so the newest one holds all
that came before, and a consumer that stops reading costs one output of memory, not a queue of
them (which would grow with the square of the tokens). Only the loop's own thread touches it
(AsyncLLM._push hands `offer` over with call_soon_threadsafe). `Deltas` turns the cumulative
outputs into the deltas `AsyncLLM.generate` yields.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from .admission import Pending


@dataclass(eq=False)
class Stream:
    """Where one request's outputs go: a one-item mailbox, and the event loop that owns it."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    newest: RequestOutput | BaseException | None = None  # not yet taken
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    pending: Pending | None = None  # its place in Admission; engine thread only

    def offer(self, item) -> None:
        """On the loop's thread: replace what is waiting (outputs are cumulative) unless that is final."""
        if not (isinstance(self.newest, RequestOutput) and self.newest.finished or isinstance(self.newest, BaseException)):
            self.newest = item
        self.ready.set()

    async def take(self):
        await self.ready.wait()
        self.ready.clear()
        item, self.newest = self.newest, None
        return item


class Deltas:
    """Turns the engine's cumulative outputs into deltas, sample by sample.

    The engine cuts a stop string off the text once the whole of it has appeared, but by
    then its first characters may already have been sent. So while a request runs, the last
    `len(longest stop) - 1` characters are held back: a stop string can only start there.
    """

    def __init__(self, params: SamplingParams):
        self.holdback = max((len(s) for s in params.stop), default=1) - 1
        self.sent_chars: dict[int, int] = {}
        self.sent_tokens: dict[int, int] = {}
        self.finished: set[int] = set()

    def next(self, out: RequestOutput) -> RequestOutput | None:
        deltas = []
        for o in out.outputs:
            if o.index in self.finished:
                continue
            chars, tokens = self.sent_chars.get(o.index, 0), self.sent_tokens.get(o.index, 0)
            upto = len(o.text) if o.finished else max(chars, len(o.text) - self.holdback)
            if upto == chars and len(o.token_ids) == tokens and not o.finished:
                continue
            deltas.append(CompletionOutput(o.index, o.text[chars:upto], o.token_ids[tokens:], o.finish_reason, o.stop_reason,
                                           None if o.logprobs is None else o.logprobs[tokens:]))
            self.sent_chars[o.index], self.sent_tokens[o.index] = upto, len(o.token_ids)
            if o.finished:
                self.finished.add(o.index)
        if not deltas and not out.finished:
            return None
        return RequestOutput(out.request_id, out.prompt, out.prompt_token_ids, deltas, out.finished, out.metrics,
                             prompt_logprobs=out.prompt_logprobs)
