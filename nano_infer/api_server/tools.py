"""Tool calling on /v1/chat/completions: OpenAI's `tools` and `tool_choice`, with vLLM's meaning.

The tools go to the model's chat template (`tools=`, which Qwen2.5's and Llama 3's templates
render); earlier turns' `tool_calls` and `role: "tool"` results go into the conversation as the
template expects them (arguments as an object, not JSON text). What happens to the reply depends on
`tool_choice`:

- "none": the reply is text.
- a named function: the reply is constrained to that function's parameters schema (chapter 07's
  masks) and becomes the arguments of one call. Exact by construction; finish_reason stays "stop",
  as OpenAI sends it for a forced function.
- "required": the reply is constrained to a JSON array of {"name", "arguments"} calls of the listed
  functions (one call with parallel_tool_calls: false; unbounded otherwise, as in vLLM: a bound of k calls
  repeats the calls' DFA k times: 8 took the compile past its 20 s limit on a busy 2-core machine); finish_reason "tool_calls".
- "auto" (the default with tools): the reply is free; Hermes-style blocks
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (what Qwen2.5's template teaches, vLLM's
  `hermes` parser) become tool calls and the text before them the content. A block that does not
  parse, or names no listed function, leaves the whole reply as text.

Streamed, a named call's arguments go out as they are generated; "required" and "auto" calls are
sent whole in the chunk that ends the choice (text before an auto call streams as usual).
"""
from __future__ import annotations

import inspect
import json
import re
import uuid
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from ..text.chat_template import Chat
from .errors import APIError
from .protocol import ProtocolError, json_text, json_values

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
OPEN = "<tool_call>"
NO_ARGUMENTS = {"type": "object", "properties": {}}
TEMPLATE_VALUES = 65_536  # JSON values a chat's tools and tool calls' arguments may carry into the chat template
# apply_chat_template's own arguments (tokenize, return_dict, chat_template, ...) and the conversation's parts:
# chat_template_kwargs only add variables for the template to read
RENDERER_ARGUMENTS = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters) | {
    "messages", "conversation", "tools", "documents", "allow_special_tokens"}


@dataclass
class ToolPlan:
    choice: str  # "none" | "auto" | "required" | "named"
    tools: list[dict]  # as OpenAI sends them: what the chat template renders
    name: str | None = None  # the function a named tool_choice forces
    parallel: bool = True

    @property
    def parameters(self) -> dict[str, dict]:
        return {t["function"]["name"]: t["function"].get("parameters") or NO_ARGUMENTS for t in self.tools}

    @property
    def schema(self) -> dict | None:
        """The JSON Schema the reply is constrained to, or None when it is free."""
        if self.choice == "named":
            return self.parameters[self.name]
        if self.choice != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": params},
                  "required": ["name", "arguments"]} for name, params in self.parameters.items()]
        return {"type": "array", "items": {"anyOf": calls}, "minItems": 1, **({} if self.parallel else {"maxItems": 1})}

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool calls) of a whole reply; no calls when it does not parse as the choice asks."""
        try:
            if self.choice == "named":
                json.loads(text)
                return None, [_call(self.name, text)]
            if self.choice == "required":
                return None, [_call(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in json.loads(text)]
        except (ValueError, KeyError, TypeError):  # cut off by max_tokens: the text is all there is
            return text, []
        if self.choice != "auto" or OPEN not in text:
            return text, []
        calls, blocks = [], TOOL_CALL.findall(text)
        if not blocks:  # an unclosed <tool_call> (cut off by max_tokens) is text
            return text, []
        for block in blocks:
            try:
                call = json.loads(block)
                arguments = call["arguments"]
                if call["name"] not in self.parameters:
                    return text, []
            except (ValueError, KeyError, TypeError):
                return text, []
            calls.append(_call(call["name"], arguments if isinstance(arguments, str)
                               else json.dumps(arguments, ensure_ascii=False)))
        content = text[: text.index(OPEN)]  # as generated (and as streamed): vLLM's hermes parser strips nothing
        return (content if content.strip() else None), calls


def _call(name: str, arguments: str) -> dict:
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_plan(body) -> ToolPlan | None:
    """What a chat body asks of tools, checked (400 naming the field); None without tools."""
    choice, tools = body.tool_choice, [t.model_dump(exclude_none=True) for t in body.tools or ()]
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools: list the functions the model may call", param="tool_choice")
        return None
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: each function needs its own name", param="tools")
    parallel = body.parallel_tool_calls is not False
    if choice is None or isinstance(choice, str):
        return ToolPlan(choice or "auto", tools, parallel=parallel)
    if choice.function.name not in names:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not in tools", param="tool_choice")
    return ToolPlan("named", tools, choice.function.name, parallel)


def text_of(content: str | list) -> str:
    """A message's content as text: a string, or text parts joined by newlines (no other part is served)."""
    if isinstance(content, str):
        return content
    if any(part.type != "text" or part.text is None for part in content):
        raise APIError(400, "messages: only text content parts are supported", param="messages")
    return "\n".join(part.text for part in content)


def chat_messages(body) -> list[dict]:
    """The conversation for the chat template: tool calls with their arguments as objects, tool results
    with their call id, and the tools themselves when there are any (a `Chat`). The template's caller
    walks every JSON value of the tools and the arguments (then the template dumps them), in Python, holding the
    tokenizer thread and the GIL: together they may hold at most TEMPLATE_VALUES."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
    budget = TEMPLATE_VALUES - json_values(tools, "tools", max_values=TEMPLATE_VALUES)
    messages = []
    for m in body.messages:
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise APIError(400, "messages: content is required (null only in an assistant message with tool_calls)",
                           param="messages")
        message = {"role": m.role, "content": "" if m.content is None else text_of(m.content)}
        if m.tool_calls:
            message["tool_calls"] = []
            for c in m.tool_calls:
                arguments = _arguments(c.function.arguments, budget)
                budget -= json_values(arguments, "messages")
                message["tool_calls"].append({"id": c.id, "type": "function",
                                              "function": {"name": c.function.name, "arguments": arguments}})
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            message["name"] = m.name
        messages.append(message)
    return Chat(messages, **_template_kwargs(body, messages, tools))


def _template_kwargs(body, messages: list[dict], tools: list[dict]) -> dict:
    """What the chat template is rendered with: the tools, vLLM's add_generation_prompt / continue_final_message,
    and the client's chat_template_kwargs (variables the template reads, never the renderer's own arguments)."""
    kwargs = dict(body.chat_template_kwargs or {})
    own = sorted(set(kwargs) & RENDERER_ARGUMENTS)
    if own:
        raise APIError(400, f"chat_template_kwargs: {own[0]!r} is the renderer's, not a template variable",
                       param="chat_template_kwargs")
    if body.continue_final_message and (body.add_generation_prompt or messages[-1]["role"] != "assistant"):
        raise APIError(400, "continue_final_message continues the last message, an assistant's: send it with "
                            "add_generation_prompt: false", param="continue_final_message")
    kwargs["add_generation_prompt"] = body.add_generation_prompt
    if body.continue_final_message:
        kwargs["continue_final_message"] = True
    if tools and body.tool_choice != "none":
        kwargs["tools"] = tools
    return kwargs


def _arguments(text: str, budget: int):
    try:
        return json_text(text, "messages.tool_calls.function.arguments", max_values=budget)
    except ProtocolError as e:
        raise APIError(400, f"{e} (tool call arguments must be JSON text, got {text[:80]!r})", param="messages") from None


@dataclass
class ToolStream:
    """One streamed choice's text turned into deltas: a named call's arguments as they come; "required"
    and "auto" calls held back and sent whole when the choice ends."""

    plan: ToolPlan
    held: str = ""  # text not sent yet
    call: dict | None = field(default=None)  # a named call, once its head (id, name) is sent

    def delta(self, text: str, finished: bool) -> dict:
        if self.plan.choice == "named":
            if self.call is None:
                self.call = _call(self.plan.name, "")
                return {"tool_calls": [{"index": 0, **self.call, "function": {"name": self.plan.name,
                                                                               "arguments": text}}]}
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]} if text else {}
        self.held += text
        if self.plan.choice == "auto" and OPEN not in self.held and not finished:
            keep = _partial_open(self.held)  # text that may be the start of a <tool_call> waits
            sent, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
            return {"content": sent} if sent else {}
        if not finished:
            return {}
        content, calls = self.plan.parse(self.held)
        delta = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
        return delta


def _partial_open(text: str) -> int:
    """How many characters at the end of `text` could begin "<tool_call>"."""
    return next((k for k in range(min(len(OPEN) - 1, len(text)), 0, -1) if OPEN.startswith(text[-k:])), 0)
