"""Where one request's outputs travel to its consumer: a mailbox on the consumer's loop, read as the caller asked.

`Stream` is a one-item mailbox rather than a queue: the engine's outputs are cumulative, so the newest one
holds all that came before, and a consumer that stops reading costs one output of memory, not a queue of
them (which would grow with the square of the tokens). Only the loop's own thread touches it
(AsyncLLM._push hands `offer` over with call_soon_threadsafe). What `AsyncLLM.generate` yields of them is
vLLM's `output_kind` (`output_kind` below): `Deltas` cuts each into what is new (DELTA), or into everything
released so far (CUMULATIVE, `Deltas.so_far`); FINAL_ONLY gets the engine's last output alone.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from ..outputs import CompletionOutput, RequestOutput, RequestOutputKind
from ..sampling_params import BeamSearchParams, SamplingParams
from .admission import Pending


def output_kind(params: SamplingParams | BeamSearchParams, stream: bool | None) -> RequestOutputKind:
    """What each output `AsyncLLM.generate` yields holds. `stream` is this package's older switch and, when given,
    wins: True is DELTA, False FINAL_ONLY. Left out (None), `params.output_kind` decides, as in vLLM (CUMULATIVE
    unless asked; BeamSearchParams has no such field and is CUMULATIVE too)."""
    if stream is not None:
        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    else:
        kind = getattr(params, "output_kind", RequestOutputKind.CUMULATIVE)
    if kind is RequestOutputKind.DELTA and isinstance(params, BeamSearchParams):
        raise ValueError("beam search cannot stream deltas: each round a row may take another beam's hypothesis, "
                         "so what is new would not extend what was sent; ask for CUMULATIVE or FINAL_ONLY")
    return kind


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
    """Turns the engine's cumulative outputs into deltas, sample by sample, and knows what has been released.

    The engine cuts a stop string off the text once the whole of it has appeared, but by
    then its first characters may already have been sent. So while a request runs, the last
    `len(longest stop) - 1` characters are held back: a stop string can only start there.
    CUMULATIVE outputs hold the same text back (vLLM does too), so each one's text extends the one before.
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
                                           None if o.logprobs is None else o.logprobs[tokens:], o.cumulative_logprob))
            self.sent_chars[o.index], self.sent_tokens[o.index] = upto, len(o.token_ids)
            if o.finished:
                self.finished.add(o.index)
        if not deltas and not out.finished:
            return None
        return RequestOutput(out.request_id, out.prompt, out.prompt_token_ids, deltas, out.finished, out.metrics,
                             prompt_logprobs=out.prompt_logprobs)

    def so_far(self, out: RequestOutput) -> RequestOutput:
        """`out` (already passed to `next`) with every sample's text cut where its deltas have reached: all that
        is released so far, token ids and logprobs whole (each sample's own, per index: n > 1, beam rows)."""
        return replace(out, outputs=[replace(o, text=o.text[: self.sent_chars.get(o.index, 0)]) for o in out.outputs])
