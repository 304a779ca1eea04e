"""/v1/responses with the openai client: the chat route's reply rendered as a Response, streamed events in OpenAI's
order that the SDK parses and accumulates, function tools (flat form) called with schema-valid arguments, earlier
calls and their outputs as chat turns, max_output_tokens -> incomplete, refused fields named, a dropped stream's
KV blocks freed."""
import json
import time

import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from nano_infer.api_server.responses import ResponsesBody, to_chat
from tests.helpers.engine_checks import assert_idle_and_blocks_free, record_aborts, serving

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]},
                                                           "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}
ASK = "What is the weather in Paris?"
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.done", "response.content_part.done",
               "response.output_item.done", "response.completed"]
CALL_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
               "response.function_call_arguments.delta", "response.function_call_arguments.done",
               "response.output_item.done", "response.completed"]
EARLIER = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
           {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
           {"type": "function_call_output", "call_id": "call_1", "output": "22 C and sunny"}]


@pytest.fixture(scope="module")
def served(qwen2_dir):
    with serving(qwen2_dir) as both:
        yield both


def strict(reply, events=()):
    """The SDK builds its objects unchecked: check every field it requires is there, with its type."""
    Response.model_validate(reply.to_dict())
    for event in events:
        TypeAdapter(ResponseStreamEvent).validate_python(event.to_dict())


def kinds(events):
    """Event types with runs of deltas collapsed to one: the order OpenAI documents."""
    out = [e.type for e in events]
    return [t for i, t in enumerate(out) if not (t.endswith(".delta") and i and out[i - 1] == t)]


def test_a_text_response_is_the_chat_reply_streamed_or_not(client, model):
    """Greedy with ignore_eos, so max_output_tokens ends it: status incomplete, for the reason OpenAI names."""
    kw = dict(model=model, instructions="Be brief.", max_output_tokens=6, temperature=0,
              extra_body={"ignore_eos": True, "store": False, "include": []})
    chat = client.chat.completions.create(model=model, max_tokens=6, temperature=0, extra_body={"ignore_eos": True},
                                          messages=[{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": ASK}])
    whole = client.responses.create(input=ASK, **kw)
    assert whole.output_text == chat.choices[0].message.content and whole.id.startswith("resp_")
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    (item,) = whole.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (chat.usage.prompt_tokens, 6)
    assert whole.max_output_tokens == 6 and whole.temperature == 0 and whole.tool_choice == "auto"
    events = list(client.responses.create(input=[{"role": "user", "content": ASK}], stream=True, **kw))
    assert kinds(events) == TEXT_EVENTS
    strict(whole, events)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    with client.responses.stream(input=ASK, **kw) as stream:  # the SDK's helper accumulates the events
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == "incomplete"
    assert final.usage.output_tokens == 6


def test_a_named_function_is_called_with_arguments_valid_for_its_schema(client, model):
    kw = dict(model=model, input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=60,
              tool_choice={"type": "function", "name": "get_weather"})
    whole = client.responses.create(**kw)
    (call,) = whole.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert whole.status == "completed" and whole.tools[0].name == "get_weather"
    events = list(client.responses.create(stream=True, **kw))
    assert kinds(events) == CALL_EVENTS
    strict(whole, events)
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == call.arguments
    done = events[-1].response.output[0]
    assert (done.type, done.name, done.arguments, done.status) == ("function_call", "get_weather", call.arguments,
                                                                    "completed")


def test_earlier_calls_and_their_outputs_reach_the_template_as_chat_turns(client, model):
    chat = client.chat.completions.create(model=model, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"}], tools=[
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}])
    reply = client.responses.create(model=model, input=EARLIER, tools=[WEATHER], max_output_tokens=4, temperature=0)
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.output_text == (chat.choices[0].message.content or "")


def test_input_items_become_the_chat_messages_they_mean():
    body = ResponsesBody.model_validate({"instructions": "Be brief.", "input": [
        *EARLIER, {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                   "content": [{"type": "output_text", "text": "It is warm.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{}"}]})
    assert to_chat(body)["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"},
        {"role": "assistant", "content": "It is warm.", "tool_calls": [{"id": "call_2", "type": "function",
                                                                         "function": {"name": "get_weather",
                                                                                      "arguments": "{}"}}]}]


@pytest.mark.parametrize("extra, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"), ({"store": True}, "store"),
    ({"background": True}, "background"), ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"include": ["reasoning.encrypted_content"]}, "include"), ({"conversation": "conv_1"}, "conversation"),
    ({"tools": [{"type": "web_search"}]}, "tools"), ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"), ({"tool_choice": {"type": "function", "name": "nope"},
                                                       "tools": [WEATHER]}, "tool_choice"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{no"}]}, "input"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"), ({"n": 2}, "n"),
    ({"stream_options": {"include_obfuscation": True}}, "stream_options")])
def test_what_cannot_be_honoured_is_refused_by_name(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input=ASK, max_output_tokens=2, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_a_model_not_served_is_not_found(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="not-this-one", input=ASK, max_output_tokens=2)


def test_a_dropped_stream_frees_its_kv_blocks(client, model, allm, monkeypatch):
    aborted = record_aborts(monkeypatch, allm.engine)
    stream = client.responses.create(model=model, input=ASK, max_output_tokens=400, stream=True,
                                     extra_body={"ignore_eos": True})
    for event in stream:
        if event.type == "response.output_text.delta":
            break
    stream.close()
    deadline = time.monotonic() + 30  # a hang guard, not a timing check: the abort lands when the server notices
    while allm.engine.requests:
        assert time.monotonic() < deadline, f"still running: {list(allm.engine.requests)}"
        time.sleep(0.02)
    client.responses.create(model=model, input="x", max_output_tokens=1)  # the inbox is FIFO: earlier aborts are done
    assert_idle_and_blocks_free(allm.engine)
    assert [o for o in aborted if o is not None], "the request ran to its end instead of being aborted"
