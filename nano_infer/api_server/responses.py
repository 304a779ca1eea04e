"""/v1/responses (OpenAI's Responses API, the openai SDK's `client.responses.create`), served through the chat route.

A Responses body is translated into the /v1/chat/completions body it means and goes down the chat's
own path: the same checks (ChatBody's types and limits, the chat template's fields), the same tool
plan and constraint compilation, the same admission per tenant. Only the reply differs
(responses_render.py). The translation:

- `instructions` -> a system message first; `input` as a string -> one user message, or as items:
  messages (`content` a string or `input_text` / `output_text` parts: a previous response's output
  sent back), `function_call` items (an assistant turn's tool calls, joined to the assistant message
  before them) and `function_call_output` items (a tool turn answering `call_id`).
- `tools` in the flat form `{"type": "function", "name", "parameters"}` -> chat's nested form;
  `tool_choice` "auto" | "none" | "required" | `{"type": "function", "name"}` with the chat's meaning.
- `max_output_tokens` -> max_tokens; `text.format` json_schema / json_object -> response_format.

Nothing is stored: a response cannot be retrieved or continued by id (`store`, `previous_response_id`,
`background`), so those fields, and what this server has no part for (`reasoning`, `include`,
`conversation`, built-in tools), are refused with 400 naming the field unless they hold the value that
asks for nothing. A refusal raised by the chat's checks names the Responses field (`input`, not
`messages`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StrictBool, StrictInt, StrictStr, Tag, ValidationError

from .errors import APIError, invalid_field
from .protocol import (MAX_LIST, MAX_MESSAGES, MAX_TOOLS, Capped, ChatBody, JsonSchemaFormat, Number, Seed, _Body)

# the chat field a refusal names -> the Responses field that carried it
PARAM = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
         "response_format": "text"}
# the chat's vLLM extras a Responses body may carry too (the openai client's extra_body), passed on as they are
PASSED = ("seed", "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "stop",
          "ignore_eos", "priority", "cache_salt", "request_id", "user", "metadata", "service_tier")
# fields defined by OpenAI with no part here, and the values that ask for nothing
NEUTRAL = {"previous_response_id": (None,), "store": (None, False), "background": (None, False),
           "reasoning": (None,), "include": (None, []), "conversation": (None,), "top_logprobs": (None, 0),
           "truncation": (None, "disabled"), "max_tool_calls": (None,), "prompt": (None,),
           "stream_options": (None, {}, {"include_obfuscation": False})}  # no obfuscation padding is sent
WHY = {"store": "responses are not kept, so none can be retrieved later", "previous_response_id": "responses are "
       "not kept: send the earlier turns in `input`", "background": "a response is served while the client waits",
       "stream_options": "no obfuscation padding is sent: include_obfuscation: false, or leave it out"}


class InputText(_Body):
    """A text part: `input_text` from a client, `output_text` from a previous response sent back."""

    type: Literal["input_text", "output_text"]
    text: StrictStr
    annotations: list | None = None
    logprobs: list | None = None


class InputMessage(_Body):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | Capped(InputText, MAX_MESSAGES)
    id: StrictStr | None = None
    status: StrictStr | None = None


class FunctionCallItem(_Body):
    """A call the model made in an earlier response, sent back with its output."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None
    status: StrictStr | None = None


class FunctionCallOutput(_Body):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr | Capped(InputText, MAX_MESSAGES)
    id: StrictStr | None = None
    status: StrictStr | None = None


def _kind(item) -> str | None:
    """Which item this is: its `type` ("message" when left out, as OpenAI's easy input messages are)."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return kind if kind in ("message", "function_call", "function_call_output") else None


Item = Annotated[Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                 | Annotated[FunctionCallOutput, Tag("function_call_output")],
                 Discriminator(_kind, custom_error_type="item_type",
                               custom_error_message="only message, function_call and function_call_output items "
                                                    "are served")]


class FunctionTool(_Body):
    type: Literal["function"]
    name: Annotated[StrictStr, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict | None = None
    strict: StrictBool | None = None


class BuiltInTool(_Body):
    """OpenAI's own tools (web_search, file_search, ...): read only to be refused by name (to_chat)."""

    model_config = {"extra": "allow"}
    type: StrictStr


ResponsesTool = Annotated[Annotated[FunctionTool, Tag("function")] | Annotated[BuiltInTool, Tag("built-in")],
                          Discriminator(lambda t: "function" if (t.get("type") if isinstance(t, dict)
                                                                 else t.type) == "function" else "built-in")]


class NamedFunction(_Body):
    type: Literal["function"]
    name: StrictStr


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only one a model without the knob gives


class ResponsesBody(_Body):
    model: StrictStr | None = None
    input: StrictStr | Annotated[list[Item], Field(min_length=1, max_length=MAX_MESSAGES, fail_fast=True)]
    instructions: StrictStr | None = None
    tools: Capped(ResponsesTool, MAX_TOOLS) | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Number | None = None
    top_p: Number | None = None
    stream: StrictBool = False
    text: TextConfig | None = None
    # NEUTRAL: refused unless they ask for nothing
    previous_response_id: StrictStr | None = None
    store: StrictBool | None = None
    background: StrictBool | None = None
    reasoning: dict | None = None
    include: Capped(StrictStr, MAX_LIST) | None = None
    conversation: StrictStr | dict | None = None
    top_logprobs: StrictInt | None = None
    truncation: StrictStr | None = None
    max_tool_calls: StrictInt | None = None
    prompt: dict | None = None
    stream_options: dict | None = None
    # PASSED: the chat body checks them
    seed: Seed | None = None
    top_k: Any = None
    min_p: Any = None
    repetition_penalty: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    stop: Any = None
    ignore_eos: Any = None
    priority: Any = None
    cache_salt: Any = None
    request_id: Any = None
    user: Any = None
    metadata: Any = None
    service_tier: Any = None
    # OpenAI's, changing nothing here
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None


def responses_request(body: ResponsesBody, chat_request: Callable[[ChatBody], Any]) -> tuple[ChatBody, Any]:
    """The chat body `body` means and what the chat route makes of it (`chat_request`), a refusal naming
    the Responses field."""
    for name, neutral in NEUTRAL.items():
        if getattr(body, name) not in neutral:
            raise APIError(400, f"{name} is not supported by this server" + (f" ({WHY[name]})" if name in WHY else "")
                           + "; leave it out", param=name)
    try:
        chat = ChatBody.model_validate(to_chat(body))
    except ValidationError as e:
        raise _renamed(invalid_field(e.errors(include_url=False, include_context=False, include_input=False)[0]))
    try:
        return chat, chat_request(chat)
    except APIError as e:
        raise _renamed(e) from e


def _renamed(error: APIError) -> APIError:
    error.param = PARAM.get(error.param, error.param)
    return error


def to_chat(body: ResponsesBody) -> dict:
    """The /v1/chat/completions body (as JSON) that asks for what `body` asks."""
    chat = {"model": body.model, "messages": _messages(body), "stream": body.stream,
            "max_tokens": body.max_output_tokens,
            **{name: getattr(body, name) for name in ("temperature", "top_p", "parallel_tool_calls", *PASSED)
               if getattr(body, name) is not None}}
    if body.tools:
        chat["tools"] = [_tool(t) for t in body.tools]
    if body.tool_choice is not None:
        choice = body.tool_choice
        chat["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                      "function": {"name": choice.name}}
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise APIError(400, "text.format: type 'json_schema' needs a 'schema'", param="text")
        schema = JsonSchemaFormat(name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=fmt.strict)
        chat["response_format"] = {"type": "json_schema", "json_schema": schema.model_dump(by_alias=True)}
    elif fmt is not None and fmt.type == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def _tool(tool: FunctionTool | BuiltInTool) -> dict:
    if not isinstance(tool, FunctionTool):
        raise APIError(400, f"tools: {tool.type!r} is one of OpenAI's built-in tools; this server serves function "
                            "tools only", param="tools")
    return {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}


def _messages(body: ResponsesBody) -> list[dict]:
    """The conversation as chat messages: function_call items join the assistant turn before them (a model's text
    and its calls are one turn), or make one of their own."""
    messages = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
    items = [InputMessage(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for item in items:
        if isinstance(item, InputMessage):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        else:
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else {}
            if last.get("role") != "assistant":
                messages.append(last := {"role": "assistant", "content": None})
            last.setdefault("tool_calls", []).append(call)
    return messages


def _text(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)
