"""Engine outputs as OpenAI response bodies: one JSON reply, or a stream of server-sent events.

Clients parse these bodies field by field, so each matches OpenAI's shape exactly: a chat
reply's choices carry a `message` (streamed: a `delta`, with the role in the first one only),
a completion's carry `text`; logprobs come in the chat or the legacy completions layout; usage
counts prompt and generated tokens. A stream is `data: {json}` lines and ends with `data: [DONE]`.
"""
from __future__ import annotations

import json
import logging
import uuid

from ..detokenizer import is_byte_level, token_bytes_table
from ..outputs import CompletionOutput
from .errors import APIError

log = logging.getLogger("nano_infer.server")


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class _Render:
    """Outputs as OpenAI choices: a chat message or a completion text, with logprobs when asked
    and the prompt in front of the text with `echo`. Keeps per-sample state across chunks."""

    def __init__(self, tokenizer, chat: bool, logprobs: int | None, echo_prompt):
        self.tokenizer, self.chat, self.logprobs = tokenizer, chat, logprobs
        self.echo = None if echo_prompt is None else (
            echo_prompt if isinstance(echo_prompt, str) else tokenizer.decode(echo_prompt))
        self.started: set[int] = set()
        self.offsets: dict[int, int] = {}  # characters of text sent per sample (completions' text_offset)

    def choice(self, o, final: bool) -> dict:
        """One choice for a CompletionOutput (a delta while streaming, the whole reply when `final`)."""
        first = o.index not in self.started
        self.started.add(o.index)
        text = (self.echo or "") + o.text if first and self.echo is not None else o.text
        logprobs = self._logprobs(o) if self.logprobs is not None else None
        self.offsets[o.index] = self.offsets.get(o.index, 0) + len(text)
        if not self.chat:
            return {"index": o.index, "text": text, "logprobs": logprobs, "finish_reason": o.finish_reason}
        if final:
            message = {"role": "assistant", "content": text}
            return {"index": o.index, "message": message, "logprobs": logprobs, "finish_reason": o.finish_reason}
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": o.index, "delta": delta, "logprobs": logprobs, "finish_reason": o.finish_reason}

    def _token(self, token_id: int) -> tuple[str, bytes]:
        data = self.tokenizer.decode([token_id]).encode() if not is_byte_level(self.tokenizer) else \
            token_bytes_table(self.tokenizer)[0][token_id]
        return data.decode("utf-8", errors="backslashreplace"), data

    def _logprobs(self, o) -> dict:
        entries = list(zip(o.token_ids, o.logprobs or []))
        if self.chat:
            content = []
            for token_id, entry in entries:
                top = sorted(entry.items(), key=lambda kv: kv[1].rank)[: self.logprobs]
                content.append({**self._entry(token_id, entry[token_id].logprob),
                                "top_logprobs": [self._entry(t, lp.logprob) for t, lp in top]})
            return {"content": content}
        offset = self.offsets.get(o.index, 0) + (len(self.echo) if self.echo and o.index not in self.offsets else 0)
        tokens, offsets = [], []
        for token_id, _ in entries:
            tokens.append(self._token(token_id)[0])
            offsets.append(offset)
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [entry[t].logprob for t, entry in entries],
                "top_logprobs": [{self._token(t)[0]: lp.logprob for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank)}
                                 for _, entry in entries],
                "text_offset": offsets}

    def _entry(self, token_id: int, logprob: float) -> dict:
        text, data = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(data)}


async def _whole_reply(outputs, head: dict, render: _Render) -> dict:
    """The non-streamed body: every sample's deltas merged into one choice each, and usage."""
    merged, prompt_tokens = {}, 0
    async for out in outputs:
        prompt_tokens = len(out.prompt_token_ids)
        for o in out.outputs:
            m = merged.setdefault(o.index, CompletionOutput(o.index, "", [], logprobs=[] if o.logprobs is not None else None))
            m.text += o.text
            m.token_ids += o.token_ids
            m.finish_reason = o.finish_reason
            if o.logprobs is not None:
                m.logprobs += o.logprobs
    choices = [render.choice(merged[i], final=True) for i in sorted(merged)]
    return {**head, "object": "chat.completion" if render.chat else "text_completion", "choices": choices,
            "usage": _usage(prompt_tokens, sum(len(m.token_ids) for m in merged.values()))}


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(first, outputs, head: dict, render: _Render, include_usage: bool):
    """The SSE body: a chunk per output with new text (or a finish), then usage, then [DONE]."""
    kind = "chat.completion.chunk" if render.chat else "text_completion"
    completion_tokens, out = 0, first
    try:
        while out is not None:
            choices = []
            for o in out.outputs:
                completion_tokens += len(o.token_ids)
                if not (o.text or o.finish_reason or o.index not in render.started or o.token_ids and render.logprobs is not None):
                    continue  # tokens whose text is still held back (half a character, a possible stop string)
                choices.append(render.choice(o, final=False))
            if choices:
                yield _event({**head, "object": kind, "choices": choices})
            prompt_tokens = len(out.prompt_token_ids)
            out = await anext(outputs, None)
        if include_usage:
            yield _event({**head, "object": kind, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
    except Exception as e:  # noqa: BLE001 - the status line is long gone: report in the stream
        error_id = uuid.uuid4().hex[:12]
        log.error("request %s failed while streaming (id %s)", head["id"], error_id, exc_info=e)
        yield _event({"error": APIError(500, f"the request failed (id {error_id}, in the server log)",
                                        "internal_server_error").body()})
    finally:  # closing early (a disconnect) aborts the request
        await outputs.aclose()
    yield "data: [DONE]\n\n"
