"""The OpenAI request bodies the server accepts, and how each becomes SamplingParams.

Every field is typed strictly (`max_tokens: true` is an error, not 1) and a field the server does
not know is refused with 400 naming it, as OpenAI does: a client must never believe it got
something it did not (a constraint, a penalty, tool calls). Fields that nano_infer does not
implement are accepted only with their neutral value (`suffix: ""`). Fields that change no output
of this server (`store`, `metadata`, `service_tier`, `parallel_tool_calls`, `user`) are accepted and
logged, as vLLM does.

Every list is capped (`Capped`) and checked with fail_fast: pydantic would otherwise validate, and
report, each of a million wrong items before the 400.

How a body becomes SamplingParams is api_server/sampling.py.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from .limits import ServerLimits
from ..sampling_params import (MAX_BAD_WORDS, MAX_CACHE_SALT, MAX_LOGPROBS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS,
                              MAX_TOKEN_RULES, SEED_RANGE)

Number = Annotated[StrictFloat, Field(allow_inf_nan=False)]  # strict floats take ints, never bools or strings
Seed = Annotated[StrictInt, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])]
MAX_N = 128  # samples per request
# choices per request (prompts x n): a sequence each, as many as one batch holds at the default max_num_seqs
MAX_CHOICES = 256
# logprob entries one reply may carry (~40-60 bytes of JSON each, and ~1 KB of Python objects while the reply is
# built): an echoed prompt's tokens count with the generated
MAX_REPLY_LOGPROBS = 2**17
MAX_MESSAGES = 2048  # messages of one chat
MAX_TOOLS = 128  # tools of one request (OpenAI's limit), tool calls of one message
MAX_LIST = 2**21  # token ids of one prompt (a 4 MiB body holds fewer), or any other list's items
MAX_CHOICE_OPTIONS = 16_384  # guided_choice strings (their text is bounded by ConstraintLimits too)
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
MAX_REQUEST_ID = 256  # characters of a client's request_id


def Capped(item, max_length: int):
    """A list of at most `max_length` items, validated up to its first bad item."""
    return Annotated[list[item], Field(max_length=max_length, fail_fast=True)]
JSON_OBJECT = {"type": "object"}  # what response_format json_object asks for: any JSON object


class ProtocolError(ValueError):
    """A request the server refuses: its message is for the client, `param` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def json_text(text: str, field: str, max_depth: int = ServerLimits.max_body_depth, max_values: int | None = None):
    """JSON carried as a string inside a field (a schema, a tool call's arguments), read within the body's
    own bounds: a text nested too deep, or with a number too long to read, is a 400 naming the field, never a
    crash in whatever walks it next (a regex compiler, a chat template)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ProtocolError(f"{field} nests deeper than {max_depth} levels", param=field.split(".")[0]) from None
    except ValueError as e:  # not JSON, or an integer past Python's limit on digits read
        raise ProtocolError(f"{field} is not valid JSON: {e}", param=field.split(".")[0]) from None
    json_values(data, field, max_depth, max_values)
    return data


def json_values(data, field: str, max_depth: int = ServerLimits.max_body_depth, max_values: int | None = None) -> int:
    """How many JSON values `data` holds (itself, every member and item), refusing with a 400 naming the field one
    that nests deeper than `max_depth` or holds more than `max_values`."""
    count, stack = 1, [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise ProtocolError(f"{field} nests deeper than {max_depth} levels", param=field.split(".")[0])
        children = node.values() if isinstance(node, dict) else node
        count += len(children)
        if max_values is not None and count > max_values:
            raise ProtocolError(f"{field} holds more than {max_values:,} JSON values", param=field.split(".")[0])
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return count


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StreamOptions(_Body):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class JsonSchemaFormat(_Body):
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    structures: list[dict] | None = None  # structural_tag (vLLM's): [{"begin", "schema", "end"}], with `triggers`
    triggers: list[StrictStr] | None = None


class StructuredOutputs(_Body):  # newer vLLM's `structured_outputs`: one of these
    regex: StrictStr | None = None
    json_: dict | StrictStr | None = Field(None, alias="json")
    choice: Capped(StrictStr, MAX_CHOICE_OPTIONS) | None = None
    json_object: StrictBool | None = None
    grammar: StrictStr | None = None  # GBNF or Lark (llguidance)
    structural_tag: dict | StrictStr | None = None  # {"structures": [{"begin", "schema", "end"}], "triggers": [...]}


class _GenerateBody(_Body):
    model: StrictStr | None = None  # None: the served model
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Number = Field(1.0, ge=0)
    top_p: Number = Field(1.0, gt=0, le=1)
    n: StrictInt = Field(1, ge=1, le=MAX_N)
    stop: StrictStr | Capped(StrictStr, MAX_STOP_STRINGS) | None = None
    seed: Seed | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    # OpenAI's, changing no output here (IGNORED): accepted and logged
    user: StrictStr | None = None
    store: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    service_tier: StrictStr | None = None
    # vLLM's: lower runs first among the tenant's own requests waiting for the engine
    priority: Annotated[StrictInt, Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])] = 0
    # vLLM's: prefix-cache blocks are shared only between requests of the same salt (and tenant)
    cache_salt: Annotated[StrictStr, Field(min_length=1, max_length=MAX_CACHE_SALT)] | None = None
    # vLLM's extras (the openai client sends them with extra_body=...)
    top_k: StrictInt = -1
    ignore_eos: StrictBool = False
    stop_token_ids: Capped(StrictInt, MAX_STOP_TOKEN_IDS) | None = None
    skip_special_tokens: StrictBool = True
    guided_regex: StrictStr | None = None
    guided_json: dict | StrictStr | None = None
    guided_choice: Capped(StrictStr, MAX_CHOICE_OPTIONS) | None = None
    guided_decoding_backend: StrictStr | None = None  # one backend here: any name picks it
    structured_outputs: StructuredOutputs | None = None
    # vLLM's beam search (api_server/beam.py): n beams, the n best hypotheses as the choices, not streamed
    use_beam_search: StrictBool = False
    length_penalty: Number = 1.0
    early_stopping: StrictBool | Literal["never"] = False
    # OpenAI's and vLLM's logits rules (SamplingParams gives their meaning and checks their ranges)
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    min_p: Number = 0.0
    min_tokens: StrictInt = 0
    logit_bias: Annotated[dict[StrictStr, Number], Field(max_length=MAX_TOKEN_RULES)] | None = None  # token id (text): bias
    bad_words: Capped(StrictStr, MAX_BAD_WORDS) | None = None
    allowed_token_ids: Capped(StrictInt, MAX_TOKEN_RULES) | None = None
    include_stop_str_in_output: StrictBool = False
    guided_grammar: StrictStr | None = None  # vLLM's older structured_outputs.grammar
    # defined by vLLM, not implemented: accepted only with the neutral value (sampling.NEUTRAL)
    guided_whitespace_pattern: StrictStr | None = None
    spaces_between_special_tokens: StrictBool | None = None
    truncate_prompt_tokens: StrictInt | None = None
    # vLLM's: the response's id (after "cmpl-" / "chatcmpl-"); the engine's own ids stay the server's
    request_id: Annotated[StrictStr, Field(min_length=1, max_length=MAX_REQUEST_ID)] | None = None
    # vLLM's: logprobs' tokens as "token_id:<id>", for tokens that are no text of their own
    return_tokens_as_token_ids: StrictBool = False


class CompletionBody(_GenerateBody):
    # OpenAI's four forms: a string, strings, token ids, lists of them; completion_prompts refuses over MAX_CHOICES
    prompt: StrictStr | Capped(StrictInt, MAX_LIST) | Capped(StrictStr, MAX_LIST) | Capped(Capped(StrictInt, MAX_LIST), MAX_LIST)
    max_tokens: StrictInt | None = Field(16, ge=0)  # OpenAI's default for completions; 0 only with echo
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: StrictBool = False
    best_of: StrictInt | None = Field(None, ge=1)
    suffix: StrictStr | None = None
    add_special_tokens: StrictBool | None = None  # vLLM's (True here: a completion's prompt gets the tokenizer's)


class ContentPart(_Body):
    type: StrictStr
    text: StrictStr | None = None


class FunctionCall(_Body):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    """A call the assistant made, sent back in a later turn's assistant message."""

    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    """`content` may be left out (null) only by an assistant message that carries `tool_calls`. `name` goes to
    the chat template as it is (a template that renders it, renders it), so it is held to OpenAI's rule for it:
    no text of a control token can hide in it (only a message's content is kept as text, chat_template.py)."""

    refusal: None = None  # these four are in a reply as the SDK dumps it, sent back: taken when null, as in vLLM
    annotations: None = None
    audio: None = None
    function_call: None = None
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Capped(ContentPart, MAX_MESSAGES) | None = None
    name: Annotated[StrictStr, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")] | None = None
    tool_calls: Capped(ToolCall, MAX_TOOLS) | None = None
    tool_call_id: StrictStr | None = None  # a role "tool" message: which call this is the result of


class FunctionDef(_Body):
    name: Annotated[StrictStr, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule for a function's name
    description: StrictStr | None = None
    parameters: dict | None = None  # a JSON Schema of the arguments object (None: no arguments)
    strict: StrictBool | None = None  # the arguments always follow the schema here (tools.py)


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: StrictStr


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


Messages = Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES, fail_fast=True)]


class ChatTemplateFields(_Body):
    """What the chat template renders besides the messages (tools.chat_messages): a chat's, and /tokenize's."""

    tools: Capped(Tool, MAX_TOOLS) | None = None  # tools.py: how they are rendered, constrained and parsed
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # vLLM's chat template controls: the generation prompt, or the last (assistant) message left open to continue,
    # and keyword arguments for the template (Qwen3's enable_thinking)
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[StrictStr, Any] | None = None


class ChatBody(_GenerateBody, ChatTemplateFields):
    messages: Messages
    max_completion_tokens: StrictInt | None = Field(None, ge=1)  # the newer name for max_tokens
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)
    parallel_tool_calls: StrictBool | None = None  # IGNORED: one call per reply at most is what is parsed
    # vLLM's, not implemented: accepted only with the neutral value (sampling.NEUTRAL)
    echo: StrictBool | None = None
    chat_template: StrictStr | None = None
    documents: list | None = None
    add_special_tokens: StrictBool | None = None


def completion_prompts(body: CompletionBody) -> list[str | list[int]]:
    """The prompts of a /v1/completions body, whichever of OpenAI's forms it used."""
    p = body.prompt
    prompts = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
    if not prompts:
        raise ProtocolError("prompt: give at least one prompt", param="prompt")
    if len(prompts) * body.n > MAX_CHOICES:
        raise ProtocolError(f"prompt: {len(prompts)} prompts x n={body.n} are {len(prompts) * body.n} choices; at most "
                            f"{MAX_CHOICES} per request", param="prompt")
    if body.max_tokens == 0 and not body.echo:
        raise ProtocolError("max_tokens: 0 is for echo: true only (the prompt back, with its logprobs)", param="max_tokens")
    return prompts


def max_prompt_tokens(prompt: str | list[int], max_model_len: int) -> int:
    """At most how many tokens `prompt` is, before tokenizing it: a token spells at least one byte of
    the text (and a tokenizer may add a leading space)."""
    if isinstance(prompt, list):
        return len(prompt)
    return min(max_model_len, len(prompt.encode("utf-8", "surrogatepass")) + 1)


def check_reply_size(echoed: list[int], n: int, max_tokens: int | None, logprobs: int | None, max_model_len: int) -> None:
    """Refuse a request whose reply could carry more than MAX_REPLY_LOGPROBS logprob entries: per
    prompt, n x (its echoed tokens + max_tokens) x (logprobs + 1). `echoed` has one count per prompt."""
    if logprobs is None:
        return
    generated = max_model_len if max_tokens is None else min(max_tokens, max_model_len)  # capped, as the engine does
    size = sum(n * (tokens + generated) * (logprobs + 1) for tokens in echoed)
    if size > MAX_REPLY_LOGPROBS:
        raise ProtocolError(f"logprobs: the reply could carry {size:,} logprobs (prompts x n x (echoed prompt tokens + "
                            f"max_tokens) x (logprobs + 1)), more than {MAX_REPLY_LOGPROBS:,}; ask for fewer prompts, "
                            f"samples, tokens or logprobs", param="logprobs")
