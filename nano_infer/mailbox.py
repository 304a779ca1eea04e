"""_Stream: where one request's outputs wait for its consumer, on the consumer's event loop.

A one-item mailbox rather than a queue: outputs are cumulative, so the newest one holds all
that came before, and a consumer that stops reading costs one output of memory, not a queue of
them (a queue of cumulative outputs grew with the square of the tokens: 1.94 GB for one stalled
stream of 32 samples x 2,000 tokens with logprobs). Only the loop's own thread touches it
(AsyncLLM._push hands `offer` over with call_soon_threadsafe).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .admission import Pending
from .outputs import RequestOutput


@dataclass(eq=False)
class _Stream:
    """Where one request's outputs go: a one-item mailbox, and the event loop that owns it."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    newest: object = None  # a RequestOutput or an exception, not yet taken
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
