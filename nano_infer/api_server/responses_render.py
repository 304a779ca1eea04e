"""A /v1/responses request's outputs as OpenAI's Response object, whole or as its stream of typed events.

The chat renderer (render._Render) still reads the outputs: it parses or streams tool calls as the
chat route does, and its message or delta is re-cut here into Responses' output items: a `message`
item with one `output_text` part when there is text (or no call), then one `function_call` item per
call. The fields are those the openai SDK's `Response` and its stream events require.

Streamed, the events come in OpenAI's order, each with its `sequence_number`: response.created and
response.in_progress, then per item output_item.added, its content (content_part.added, an
output_text.delta per text delta, output_text.done, content_part.done; or function_call_arguments
.delta / .done), output_item.done; last response.completed with the whole Response, whose status is
"incomplete" when max_output_tokens cut it (as vLLM sends it; the SDK's `responses.stream` helper
takes its final response from that event).
"""
from __future__ import annotations

import itertools
import json
import logging
import time
import uuid

from .errors import APIError
from .responses import ResponsesBody

log = logging.getLogger("nano_infer.api_server")


class ResponseReply:
    """One request's Response: its id, the body's settings it echoes, and how it is rendered."""

    def __init__(self, body: ResponsesBody, model_name: str):
        self.body, self.model_name = body, model_name
        self.id, self.created = "resp_" + uuid.uuid4().hex, int(time.time())

    def response(self, status: str, output: list[dict], usage: dict | None = None) -> dict:
        b, choice = self.body, self.body.tool_choice
        fmt = b.text.format.model_dump(by_alias=True, exclude_none=True) if b.text and b.text.format \
            else {"type": "text"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "completed_at": None if status == "in_progress" else int(time.time()), "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": self.model_name,
                "output": output, "parallel_tool_calls": b.parallel_tool_calls is not False,
                "previous_response_id": None, "reasoning": None, "store": False,
                "temperature": 1.0 if b.temperature is None else b.temperature, "text": {"format": fmt},
                "tool_choice": "auto" if choice is None else choice if isinstance(choice, str) else choice.model_dump(),
                "tools": [t.model_dump() for t in b.tools or ()], "top_p": 1.0 if b.top_p is None else b.top_p,
                "truncation": "disabled", "usage": usage, "user": b.user, "metadata": b.metadata or {}}

    def whole(self, collected, render) -> bytes:
        """The non-streamed reply (on a worker, in the tenant's turn): the chat's message as output items."""
        merged, owner, prompts = collected
        o = merged[0]
        choice = render.choice(owner[0], o, final=True)
        cut = choice["finish_reason"] == "length"
        message = choice["message"]
        output = [_message(_id("msg"), message["content"] or "", cut)] \
            if message["content"] or not message.get("tool_calls") else []
        output += [_call(c, "completed") for c in message.get("tool_calls", ())]
        chat = prompts.usage(len(o.token_ids))
        usage = _usage(chat["prompt_tokens"], chat["prompt_tokens_details"]["cached_tokens"], len(o.token_ids))
        reply = self.response("incomplete" if cut else "completed", output, usage)
        return json.dumps(reply, ensure_ascii=False).encode()

    async def events(self, first, outputs, render):
        """The SSE body: the response's events as the outputs come (see the module's docstring)."""
        items, tokens, prompt, cut, out = _Items(), 0, (0, 0), False, first
        try:
            yield items.event("response.created", response=self.response("in_progress", []))
            yield items.event("response.in_progress", response=self.response("in_progress", []))
            while out is not None:
                prompt = (len(out.prompt_token_ids), out.num_cached_tokens)
                for o in out.outputs:
                    tokens += len(o.token_ids)
                    cut = o.finish_reason == "length"
                    if o.text or o.finish_reason or o.index not in render.started:  # else text still held back
                        for event in items.delta(render.choice(out, o, final=False)["delta"]):
                            yield event
                out = await anext(outputs, None)
            for event in items.finish(cut):
                yield event
            yield items.event("response.completed", response=self.response("incomplete" if cut else "completed",
                                                                           items.done, _usage(*prompt, tokens)))
        except Exception as e:  # noqa: BLE001 - the status line is long gone: report in the stream
            error_id = uuid.uuid4().hex[:12]
            log.error("response %s failed while streaming (id %s)", self.id, error_id, exc_info=e)
            error = APIError(500, f"the request failed (id {error_id}, in the server log)", "internal_server_error")
            yield items.event("error", code=error.type, message=error.message, param=None)
        finally:  # closing early (a disconnect) aborts the request
            await outputs.aclose()


class _Items:
    """The output items of one stream: the open one (a message or a call) and those done, and the events that
    open, fill and close them, numbered in order."""

    def __init__(self):
        self.done: list[dict] = []
        self.open: dict | None = None
        self.numbers = itertools.count()

    def event(self, kind: str, **fields) -> str:
        data = json.dumps({"type": kind, **fields, "sequence_number": next(self.numbers)}, ensure_ascii=False)
        return f"event: {kind}\ndata: {data}\n\n"

    def delta(self, delta: dict) -> list[str]:
        """The events of one chat delta: text for the message, tool calls (a head with its id, then arguments)."""
        events = []
        if delta.get("content"):
            if self.open is None or self.open["type"] != "message":
                events += self._close(False) + self._open(_message(_id("msg"), "", False, "in_progress"))
                events.append(self._at("response.content_part.added", content_index=0, part=_part("")))
            self.open["content"][0]["text"] += delta["content"]
            events.append(self._at("response.output_text.delta", content_index=0, delta=delta["content"], logprobs=[]))
        for call in delta.get("tool_calls", ()):
            if "id" in call:
                head = {**call, "function": {**call["function"], "arguments": ""}}  # arguments follow as deltas
                events += self._close(False) + self._open(_call(head, "in_progress"))
            arguments = call["function"].get("arguments")
            if arguments:
                self.open["arguments"] += arguments
                events.append(self._at("response.function_call_arguments.delta", delta=arguments))
        return events

    def finish(self, cut: bool) -> list[str]:
        """Close the open item; a reply of no text and no call is one empty message, as the whole reply has."""
        if self.open is None and not self.done:
            return self._open(_message(_id("msg"), "", cut, "in_progress")) + \
                [self._at("response.content_part.added", content_index=0, part=_part(""))] + self._close(cut)
        return self._close(cut)

    def _open(self, item: dict) -> list[str]:
        self.open = item
        return [self.event("response.output_item.added", output_index=len(self.done), item=item)]

    def _at(self, kind: str, **fields) -> str:
        """An event about the open item."""
        return self.event(kind, item_id=self.open["id"], output_index=len(self.done), **fields)

    def _close(self, cut: bool) -> list[str]:
        item, events = self.open, []
        if item is None:
            return events
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(self._at("response.output_text.done", content_index=0, text=text, logprobs=[]))
            events.append(self._at("response.content_part.done", content_index=0, part=_part(text)))
        else:  # a named call's arguments cut by max_output_tokens are no JSON: the item says so
            events.append(self._at("response.function_call_arguments.done", name=item["name"],
                                   arguments=item["arguments"]))
        item["status"] = "incomplete" if cut else "completed"
        events.append(self._at("response.output_item.done", item=item))
        self.done.append(item)
        self.open = None
        return events


def _id(kind: str) -> str:
    return f"{kind}_{uuid.uuid4().hex}"


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(item_id: str, text: str, cut: bool, status: str | None = None) -> dict:
    return {"type": "message", "id": item_id, "role": "assistant", "content": [_part(text)],
            "status": status or ("incomplete" if cut else "completed")}


def _call(call: dict, status: str) -> dict:
    """A chat tool call as a function_call item: the chat's call id is its call_id."""
    return {"type": "function_call", "id": _id("fc"), "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def _usage(input_tokens: int, cached_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}
