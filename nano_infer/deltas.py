"""_Deltas: the engine's cumulative outputs as deltas, what AsyncLLM.generate yields."""
from __future__ import annotations

from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams


class _Deltas:
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
