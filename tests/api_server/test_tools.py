"""Tool calling with the openai client: tool_choice named, required and auto (Hermes <tool_call> blocks), arguments
valid against each tool's schema, a tool-result turn, streamed tool-call deltas that join into the same calls;
what cannot be honoured refused by name."""
import json

import jsonschema
import openai
import pytest

from nano_infer.api_server.tools import ToolPlan, ToolStream
from tests.helpers.engine_checks import serving

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo", "北京"]},
                                                    "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 5}, "offset": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["zone", "offset"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES = r'I will look\. <tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Tokyo)"\}\}\n</tool_call>'


@pytest.fixture(scope="module")
def served(qwen2_dir):
    with serving(qwen2_dir) as both:
        yield both


def ask(client, model, stream=False, **kw):
    return client.chat.completions.create(model=model, messages=kw.pop("messages", CHAT), max_tokens=kw.pop("max_tokens", 200),
                                          tools=TOOLS,
                                          stream=stream, **kw)


def check_calls(calls):
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        assert call.type == "function" and call.id.startswith("call_")


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_a_named_function_is_called_with_arguments_valid_by_construction(client, model, temperature):
    reply = ask(client, model, temperature=temperature, seed=2,
                tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0]
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_time" and reply.message.content is None and reply.finish_reason == "stop"
    check_calls([call])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_calls_listed_functions(client, model, parallel):
    reply = ask(client, model, temperature=1.0, seed=4, tool_choice="required", parallel_tool_calls=parallel).choices[0]
    calls = reply.message.tool_calls
    assert calls and reply.finish_reason == "tool_calls" and (parallel or len(calls) == 1)
    check_calls(calls)


def test_auto_parses_hermes_tool_call_blocks(client, model):
    """The model's text is forced into a Hermes block (a random model writes none of its own): the parser's input."""
    reply = ask(client, model, temperature=0, tool_choice="auto", extra_body={"guided_regex": HERMES}).choices[0]
    (call,) = reply.message.tool_calls
    assert reply.message.content == "I will look. " and reply.finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    check_calls([call])
    plain = ask(client, model, temperature=0, max_tokens=5, extra_body={"ignore_eos": True}).choices[0]
    assert plain.message.tool_calls is None and plain.finish_reason == "length" and plain.message.content


def joined(chunks):
    """Streamed tool-call deltas joined per index, as OpenAI's clients do."""
    calls, content, finish = {}, "", None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or ():
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                call["name"] += d.function.name or "" if d.function else ""
                call["arguments"] += d.function.arguments or "" if d.function else ""
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice,extra", [
    ({"type": "function", "function": {"name": "get_weather"}}, {}), ("required", {}),
    ("auto", {"guided_regex": HERMES})])
def test_streamed_tool_call_deltas_join_into_the_same_calls(client, model, choice, extra):
    whole = ask(client, model, temperature=0, tool_choice=choice, extra_body=extra).choices[0]
    content, calls, finish = joined(ask(client, model, stream=True, temperature=0, tool_choice=choice, extra_body=extra))
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert (content or None) == whole.message.content and finish == whole.finish_reason
    assert all(c["id"] for c in calls)


def test_a_tool_result_turn(client, model):
    messages = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    reply = ask(client, model, messages=messages, temperature=0, max_tokens=4)
    first = ask(client, model, temperature=0, max_tokens=4)
    assert reply.usage.prompt_tokens > first.usage.prompt_tokens  # the result is in the prompt
    assert reply.choices[0].message.content is not None


@pytest.mark.parametrize("extra,param", [
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "use_beam_search": True, "n": 2}, "use_beam_search"),
    ({"messages": [{"role": "user", "content": None}]}, "messages"),
    ({"chat_template": "{{ messages }}"}, "chat_template"),  # a client's Jinja would run on the server
    # over the constraint limits, found where it compiles: named as the field that asked for the constraint
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 100_000}}, "required": ["s"]}}}], "tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}]}, "messages"),
])
def test_what_cannot_be_honoured_is_refused_by_name(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=extra.pop("messages", CHAT), max_tokens=4,
                                       extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_auto_parsing_and_holding_back_a_possible_tool_call():
    plan = ToolPlan("auto", TOOLS)
    text = 'Sure.<tool_call>{"name": "get_time", "arguments": {"zone": "UTC", "offset": 0}}</tool_call>'
    content, calls = plan.parse(text)
    assert content == "Sure." and json.loads(calls[0]["function"]["arguments"]) == {"zone": "UTC", "offset": 0}
    assert plan.parse('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>')[1] == []  # not a listed function
    assert plan.parse("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])
    assert plan.parse('a <tool_call>{"name": "get_time", "argu') == ('a <tool_call>{"name": "get_time", "argu', [])
    stream = ToolStream(plan)
    deltas = [stream.delta(piece, False) for piece in ("Sure.", "<tool", "_call>{\"name\": \"get_time\", ")]
    assert deltas == [{"content": "Sure."}, {}, {}]  # "<tool" might open a call: held back
    last = stream.delta('"arguments": {"zone": "UTC", "offset": 0}}</tool_call>', True)
    assert last["tool_calls"][0]["function"]["name"] == "get_time" and "content" not in last
    stream = ToolStream(plan)
    assert [stream.delta("a <", False), stream.delta("b", False), stream.delta("", True)] == [
        {"content": "a "}, {"content": "<b"}, {}]


def test_tools_and_earlier_calls_reach_the_chat_template(tokenizer):
    """What a template that renders tools (as Qwen2.5's does) is given: the tools, and earlier calls' arguments as
    objects (the template writes them with tojson)."""
    from copy import deepcopy
    from types import SimpleNamespace

    from nano_infer import LLM
    from nano_infer.api_server.protocol import ChatBody
    from nano_infer.api_server.tools import chat_messages

    tok = deepcopy(tokenizer)
    tok.chat_template = ("{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}{% for m in messages %}"
                         "{% for c in m.tool_calls or [] %}[call {{ c.function.arguments | tojson }}]{% endfor %}"
                         "{{ m.role }}: {{ m.content }}\n{% endfor %}")
    body = ChatBody.model_validate({"messages": CHAT + [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": TOOLS})
    ids = LLM.apply_chat_template(SimpleNamespace(tokenizer=tok), chat_messages(body),
                                  add_generation_prompt=False)
    text = tok.decode(ids)
    assert "[tool get_weather][tool get_time]" in text and '[call {"city": "Paris"}]' in text and "tool: sunny" in text


def test_the_shipped_tool_template_renders_tools_calls_and_results_the_parser_reads_back(tokenizer):
    """chatml_tools: a plain chat renders exactly as plain ChatML (the test models' template); with tools, each
    tool's JSON is in the system turn, an earlier call renders as a block the hermes parser turns back into that
    call, and consecutive tool results share one user turn."""
    from copy import deepcopy

    from nano_infer.text.chat_template import resolve_chat_template

    tok = deepcopy(tokenizer)
    plain = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    tok.chat_template = resolve_chat_template("chatml_tools")
    assert tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == plain
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    chat = CHAT + [{"role": "assistant", "content": "", "tool_calls": [call, {**call, "id": "c2"}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                   {"role": "tool", "tool_call_id": "c2", "content": "warm"}]
    text = tok.apply_chat_template(chat, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert all(json.dumps(t["function"], ensure_ascii=False) in text for t in TOOLS)
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    _, calls = ToolPlan("auto", TOOLS).parse(turn)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})] * 2
    assert text.count("<|im_start|>user") == 2 and "sunny\n</tool_response>\n<tool_response>\nwarm" in text


def test_chat_template_option_takes_a_name_a_file_or_text_and_refuses_anything_else(qwen2_dir, tmp_path):
    from nano_infer import LLM
    from nano_infer.config import EngineConfig

    (tmp_path / "t.jinja").write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    llm = LLM(str(qwen2_dir), dtype="float32", chat_template=str(tmp_path / "t.jinja"))
    assert llm.tokenizer.decode(llm.apply_chat_template(CHAT, add_generation_prompt=False)) == "<user>" + CHAT[0]["content"]
    with pytest.raises(ValueError, match="neither a file, a template shipped with nano_infer .chatml_tools"):
        EngineConfig(chat_template="no_such_template")
    with pytest.raises(ValueError, match="does not parse: .*line 2"):
        EngineConfig(chat_template="{{ messages }}\n{% for m in messages %}")
