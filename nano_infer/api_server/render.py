"""Engine outputs as OpenAI response bodies: one JSON reply, or a stream of server-sent events.

Clients parse these bodies field by field, so each matches OpenAI's shape exactly: a chat
reply's choices carry a `message` (streamed: a `delta`, with the role in the first one only),
a completion's carry `text`; logprobs come in the chat or the legacy completions layout; usage
counts prompt and generated tokens. A stream is `data: {json}` lines and ends with `data: [DONE]`.
Usage also says how many prompt tokens came from the prefix cache (`prompt_tokens_details`).

A whole reply is built and serialised by the server's workers (`whole_reply_bytes`), a choice at a time,
in its tenant's turn: built on the event loop, a reply of millions of logprobs would stop every other
stream meanwhile, and built in one piece it would hold the workers from other tenants' bodies.

A completion with `echo` starts with its prompt: its text, and with `logprobs` its tokens' logprobs
too (the engine's prompt logprobs: `null` for the first token, as OpenAI sends them). Outputs of
several prompts come merged (fanout.py): each carries its own prompt.
"""
from __future__ import annotations

import json
import logging
import uuid

from ..text.detokenizer import is_byte_level, token_bytes_table
from ..outputs import CompletionOutput
from .errors import APIError
from .tools import ToolPlan, ToolStream

log = logging.getLogger("nano_infer.api_server")


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class _Prompts:
    """Prompt and cached token counts, per engine request (one per prompt), summed for usage."""

    def __init__(self):
        self.tokens: dict[str, tuple[int, int]] = {}

    def add(self, out) -> None:
        self.tokens[out.request_id] = (len(out.prompt_token_ids), out.num_cached_tokens)

    def usage(self, completion_tokens: int) -> dict:
        return _usage(sum(t for t, _ in self.tokens.values()), completion_tokens, sum(c for _, c in self.tokens.values()))


class _Render:
    """Outputs as OpenAI choices: a chat message or a completion text, with logprobs when asked
    and the prompt in front of the text with `echo`. Keeps per-sample state across chunks."""

    def __init__(self, tokenizer, chat: bool, logprobs: int | None, echo: bool = False, tools: ToolPlan | None = None,
                 tokens_as_ids: bool = False):
        self.tokenizer, self.chat, self.logprobs, self.echo = tokenizer, chat, logprobs, echo
        self.tokens_as_ids = tokens_as_ids  # vLLM's return_tokens_as_token_ids: logprobs' tokens as "token_id:<id>"
        self.tools = tools if tools is not None and tools.choice != "none" else None
        self.started: set[int] = set()
        self.offsets: dict[int, int] = {}  # characters of text sent per sample (completions' text_offset)
        self.tool_streams: dict[int, ToolStream] = {}  # per sample, with tools

    def choice(self, out, o, final: bool) -> dict:
        """One choice for a CompletionOutput `o` of the RequestOutput `out` (a delta while streaming,
        the whole reply when `final`)."""
        first = o.index not in self.started
        self.started.add(o.index)
        prompt = self._prompt_text(out) if first and self.echo else None  # echoed in front of the first text
        text = (prompt or "") + o.text
        logprobs = self._logprobs(out, o, prompt) if self.logprobs is not None else None
        self.offsets[o.index] = self.offsets.get(o.index, 0) + len(text)
        if not self.chat:
            return {"index": o.index, "text": text, "logprobs": logprobs, "finish_reason": o.finish_reason}
        if self.tools is not None:
            return self._tool_choice(o, text, first, final, logprobs)
        if final:
            message = {"role": "assistant", "content": text}
            return {"index": o.index, "message": message, "logprobs": logprobs, "finish_reason": o.finish_reason}
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": o.index, "delta": delta, "logprobs": logprobs, "finish_reason": o.finish_reason}

    def _tool_choice(self, o, text: str, first: bool, final: bool, logprobs) -> dict:
        """A chat choice whose text may be tool calls (tools.py): parsed whole, or streamed as tool-call deltas."""
        if final:
            content, calls = self.tools.parse(text)
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            return {"index": o.index, "message": message, "logprobs": logprobs,
                    "finish_reason": self._finish(o.finish_reason, calls)}
        stream = self.tool_streams.setdefault(o.index, ToolStream(self.tools))
        delta = stream.delta(text, o.finish_reason is not None)
        delta = {"role": "assistant", "content": None, **delta} if first else delta
        return {"index": o.index, "delta": delta, "logprobs": logprobs,
                "finish_reason": self._finish(o.finish_reason, delta.get("tool_calls"))}

    def _finish(self, reason: str | None, calls) -> str | None:
        """"tool_calls" when the model chose to call ("auto", "required"); a forced function's reply stays "stop"."""
        return "tool_calls" if calls and reason == "stop" and self.tools.choice != "named" else reason

    def _token(self, token_id: int) -> tuple[str, bytes]:
        """A token's text and bytes; a checkpoint's padding rows past the tokenizer (they can rank among a
        row's top logprobs) are no text, as the tokenizer decodes them."""
        if not is_byte_level(self.tokenizer):
            data = self.tokenizer.decode([token_id]).encode()
        else:
            table = token_bytes_table(self.tokenizer)[0]
            data = table[token_id] if token_id < len(table) else b""
        return f"token_id:{token_id}" if self.tokens_as_ids else data.decode("utf-8", errors="backslashreplace"), data

    def _prompt_text(self, out) -> str:
        return out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)

    def _logprobs(self, out, o, prompt: str | None) -> dict:
        entries = list(zip(o.token_ids, o.logprobs or []))
        if self.chat:
            content = []
            for token_id, entry in entries:
                top = sorted(entry.items(), key=lambda kv: kv[1].rank)[: self.logprobs]
                content.append({**self._entry(token_id, entry[token_id].logprob),
                                "top_logprobs": [self._entry(t, lp.logprob) for t, lp in top]})
            return {"content": content}
        body = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if prompt is not None and out.prompt_logprobs is not None:  # echo: the prompt's tokens come first
            self._add_tokens(body, list(zip(out.prompt_token_ids, out.prompt_logprobs)), 0)
        self._add_tokens(body, entries, self.offsets.get(o.index, 0) + len(prompt or ""))
        return body

    def _add_tokens(self, body: dict, entries: list, offset: int) -> None:
        """Completions' layout: parallel lists; a token without an entry (the prompt's first) gets nulls."""
        for token_id, entry in entries:
            body["tokens"].append(self._token(token_id)[0])
            body["token_logprobs"].append(None if entry is None else entry[token_id].logprob)
            body["top_logprobs"].append(None if entry is None else {
                self._token(t)[0]: lp.logprob for t, lp in sorted(entry.items(), key=lambda kv: kv[1].rank)})
            body["text_offset"].append(offset)
            offset += len(body["tokens"][-1])

    def _entry(self, token_id: int, logprob: float) -> dict:
        text, data = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(data)}


async def _whole_reply(outputs) -> tuple[dict, dict, _Prompts]:
    """Every sample's deltas merged into one output each (keyed by choice index), the output of the
    request each belongs to, and the prompts' token counts: what whole_reply_bytes renders."""
    merged, owner, prompts = {}, {}, _Prompts()
    async for out in outputs:
        prompts.add(out)
        for o in out.outputs:
            owner[o.index] = out  # the request (prompt) of the choice
            m = merged.setdefault(o.index, CompletionOutput(o.index, "", [], logprobs=[] if o.logprobs is not None else None))
            m.text += o.text
            m.token_ids += o.token_ids
            m.finish_reason = o.finish_reason
            if o.logprobs is not None:
                m.logprobs += o.logprobs
    return merged, owner, prompts


async def whole_reply_bytes(collected: tuple[dict, dict, _Prompts], head: dict, render: _Render, run) -> bytes:
    """The non-streamed body as JSON, each choice built and serialised by `await run(fn, *args)` (a worker, in
    the tenant's turn): json.dumps holds the GIL for as long as its whole input takes, so one call for the
    whole reply would pause the other threads, and one job for it would hold a worker from other tenants."""
    merged, owner, prompts = collected
    choices = [await run(_choice_json, render, owner[i], merged[i]) for i in sorted(merged)]
    top = json.dumps({**head, "object": "chat.completion" if render.chat else "text_completion"}, ensure_ascii=False)
    usage = json.dumps(prompts.usage(sum(len(m.token_ids) for m in merged.values())))
    return (top[:-1] + ', "choices": [' + ", ".join(choices) + '], "usage": ' + usage + "}").encode()


def _choice_json(render: _Render, out, o) -> str:
    return json.dumps(render.choice(out, o, final=True), ensure_ascii=False)


def _event(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def sse_events(first, outputs, head: dict, render: _Render, include_usage: bool, continuous_usage: bool = False):
    """The SSE body: a chunk per output with new text (or a finish), then usage, then [DONE].
    `continuous_usage` (vLLM's stream_options.continuous_usage_stats): usage so far in every chunk."""
    kind = "chat.completion.chunk" if render.chat else "text_completion"
    completion_tokens, prompts, out = 0, _Prompts(), first
    try:
        while out is not None:
            choices = []
            for o in out.outputs:
                completion_tokens += len(o.token_ids)
                if not (o.text or o.finish_reason or o.index not in render.started or o.token_ids and render.logprobs is not None):
                    continue  # tokens whose text is still held back (half a character, a possible stop string)
                choices.append(render.choice(out, o, final=False))
            prompts.add(out)
            if choices:
                usage = {"usage": prompts.usage(completion_tokens)} if continuous_usage else {}
                yield _event({**head, "object": kind, "choices": choices, **usage})
            out = await anext(outputs, None)
        if include_usage:
            yield _event({**head, "object": kind, "choices": [], "usage": prompts.usage(completion_tokens)})
    except Exception as e:  # noqa: BLE001 - the status line is long gone: report in the stream
        error_id = uuid.uuid4().hex[:12]
        log.error("request %s failed while streaming (id %s)", head["id"], error_id, exc_info=e)
        yield _event({"error": APIError(500, f"the request failed (id {error_id}, in the server log)",
                                        "internal_server_error").body()})
    finally:  # closing early (a disconnect) aborts the request
        await outputs.aclose()
    yield "data: [DONE]\n\n"
