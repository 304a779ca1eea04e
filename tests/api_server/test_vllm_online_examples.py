"""vLLM's online-serving clients, in their shape, with only the base URL and the model changed.

This project's own scripts making the calls vLLM's examples in examples/online_serving make with the openai
client: chat completions (whole and streamed), completions with `n`, `logprobs` and `echo`, tool calling
(a tool call, its result sent back as a `tool` turn, the answer; streamed deltas joined per index),
structured outputs through `extra_body` and `response_format`, and the Responses API (text, a function tool
and its output, streamed events). One server for the module: the model shipped in the package, served as
`nano-infer serve --chat-template chatml_tools --enable-auto-tool-choice --tool-call-parser hermes` would
serve it. Each script runs as `__main__` with the server's URL as its base URL; the tests read what it printed.
The shipped model (and SmolLM2-135M, tried greedy with this template) writes no `<tool_call>` block of its
own, so `tool_choice: "auto"` ends in a text reply; the calls come from `"required"` and a named function.
"""
import contextlib
import io
import json
import re
import sys

import pytest
from transformers import AutoTokenizer

from nano_infer.models.loader import TINY_MODEL_DIR
from nano_infer.text.chat_template import TEMPLATES
from tests.helpers.engine_checks import serving

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CHAT_CLIENT = '''
import argparse

from openai import OpenAI

messages = [{"role": "system", "content": "You are a player in a company of actors."},
            {"role": "user", "content": "Who wrote the play?"},
            {"role": "assistant", "content": "A man of Stratford wrote it."},
            {"role": "user", "content": "Where was it first played?"}]

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    client = OpenAI(api_key="EMPTY", base_url=BASE_URL)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(messages=messages, model=model, stream=args.stream, max_tokens=24,
                                           temperature=0)
    if args.stream:
        for chunk in reply:
            if chunk.choices and chunk.choices[0].delta.content:
                print(f"piece: {chunk.choices[0].delta.content!r}")
    else:
        print(f"reply: {reply.choices[0].message.content!r} finish: {reply.choices[0].finish_reason}")
'''

COMPLETION_CLIENT = '''
import argparse
import json

from openai import OpenAI

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--echo", action="store_true")
    args = parser.parse_args()
    client = OpenAI(api_key="EMPTY", base_url=BASE_URL)
    model = client.models.list().data[0].id
    completion = client.completions.create(model=model, prompt="Friends, Romans, countrymen,", echo=args.echo, n=2,
                                           stream=args.stream, logprobs=3, max_tokens=8, temperature=0.8, seed=5)
    for choice in [c for chunk in completion for c in chunk.choices] if args.stream else completion.choices:
        print(json.dumps({"index": choice.index, "text": choice.text, "tokens": choice.logprobs.tokens,
                          "tops": [len(t or {}) for t in choice.logprobs.top_logprobs], "finish": choice.finish_reason}))
'''

TOOLS_CLIENT = '''
import argparse
import json

from openai import OpenAI

tools = [{"type": "function", "function": {
    "name": "get_current_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12, "description": "the city, e.g. 'Verona'"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}]
messages = [{"role": "user", "content": "Good morrow!"},
            {"role": "assistant", "content": "Good morrow. How may I serve you?"},
            {"role": "user", "content": "Will it rain in Verona tonight, in celsius?"}]


def get_current_weather(city: str, unit: str) -> str:
    return f"In {city} it is 12 degrees {unit}, and raining."


def joined(stream) -> list[dict]:
    """Streamed tool-call deltas put together per index, as a client must."""
    calls: dict[int, dict] = {}
    for chunk in stream:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": delta.id, "name": delta.function.name, "arguments": ""})
            call["arguments"] += delta.function.arguments or ""  # the first delta of a call names it
    return [calls[i] for i in sorted(calls)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool-choice", default="auto")
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    choice = args.tool_choice if args.tool_choice in ("auto", "required") else {"type": "function", "function": {
        "name": args.tool_choice}}
    client = OpenAI(api_key="EMPTY", base_url=BASE_URL)
    model = client.models.list().data[0].id
    asked = dict(messages=messages, model=model, tools=tools, tool_choice=choice, max_tokens=150, temperature=0,
                 parallel_tool_calls=False)
    if args.stream:
        calls = joined(client.chat.completions.create(stream=True, **asked))
    else:
        message = client.chat.completions.create(**asked).choices[0].message
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
        if not calls:
            print(f"text: {message.content!r}")
    for call in calls:
        print(f"call: {json.dumps(call)}")
    if calls:
        messages.append({"role": "assistant", "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls]})
        for call in calls:
            result = {"get_current_weather": get_current_weather}[call["name"]](**json.loads(call["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        answer = client.chat.completions.create(messages=messages, model=model, tools=tools, max_tokens=12, temperature=0)
        print(f"answer: {answer.choices[0].message.content!r} prompt_tokens: {answer.usage.prompt_tokens}")
'''

STRUCTURED_CLIENT = '''
import json

from openai import OpenAI
from pydantic import BaseModel, Field

client = OpenAI(api_key="EMPTY", base_url=BASE_URL)
model = client.models.list().data[0].id


class Player(BaseModel):
    name: str = Field(max_length=10)
    lines: int = Field(ge=0, le=999)


SQL = """
root ::= "SELECT " field " FROM " table
field ::= "name" | "age"
table ::= "players" | "plays"
"""
TAG = {"type": "structural_tag", "triggers": ["I am"],  # once the model writes "I am", " in <city>", a city, "</city>"
       "structures": [{"begin": "I am in <city>", "schema": {"enum": ["Rome", "Verona"]}, "end": "</city>"}]}


def ask(content: str, max_tokens: int = 40, **kw) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                           max_tokens=max_tokens, temperature=0, **kw)
    return reply.choices[0].message.content


if __name__ == "__main__":
    print("choice:", json.dumps(ask("Is it good?", extra_body={"structured_outputs": {"choice": ["good", "bad"]}})))
    print("regex:", json.dumps(ask("Write an address:", stop=["\\n"],
                                   extra_body={"structured_outputs": {"regex": r"[a-z]{2,8}@[a-z]{2,8}\\.com\\n"}})))
    print("json:", json.dumps(ask("Name a player:", response_format={
        "type": "json_schema", "json_schema": {"name": "player", "schema": Player.model_json_schema()}})))
    print("grammar:", json.dumps(ask("A query:", extra_body={"structured_outputs": {"grammar": SQL}})))
    print("structural_tag:", json.dumps(ask("Where do the players go?", response_format=TAG, max_tokens=60)))
'''

RESPONSES_CLIENT = '''
import json

from openai import OpenAI

tools = [{"type": "function", "name": "get_weather", "description": "The weather now in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Rome", "Verona"]}},
                         "required": ["city"]}}]


def get_weather(city: str) -> str:
    return f"Rain in {city}."


if __name__ == "__main__":
    client = OpenAI(api_key="EMPTY", base_url=BASE_URL)
    model = client.models.list().data[0].id
    plain = client.responses.create(model=model, input="Tell me of Verona.", max_output_tokens=12, temperature=0)
    print(f"text: {plain.output_text!r} status: {plain.status} tokens: {plain.usage.output_tokens}")

    asked = [{"role": "user", "content": "What is the weather in Verona?"}]
    response = client.responses.create(model=model, input=asked, tools=tools, tool_choice="required",
                                       max_output_tokens=150, temperature=0, parallel_tool_calls=False)
    call = response.output[0]
    print(f"call: {call.type} {call.name} {call.arguments} input_tokens: {response.usage.input_tokens}")
    asked.append(call)
    asked.append({"type": "function_call_output", "call_id": call.call_id,
                  "output": get_weather(**json.loads(call.arguments))})
    second = client.responses.create(model=model, input=asked, tools=tools, max_output_tokens=12, temperature=0)
    print(f"after the call: {second.output_text!r} input_tokens: {second.usage.input_tokens}")

    for event in client.responses.create(model=model, input="Tell me of Verona.", max_output_tokens=12,
                                         temperature=0, stream=True):
        print(f"event: {event.type} {getattr(event, 'delta', '')!r}")
'''


@pytest.fixture(scope="module")
def served():
    with serving(TINY_MODEL_DIR, chat_template="chatml_tools", max_model_len=1024) as both:
        yield both


def run_client(source: str, server, *argv: str) -> str:
    """Run a client script as __main__ with the server's /v1 as its base URL and `argv` on its command line;
    what it printed."""
    out, saved = io.StringIO(), sys.argv
    sys.argv = ["client.py", *argv]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, "client.py", "exec"), {"__name__": "__main__", "BASE_URL": server.url + "/v1"})
    finally:
        sys.argv = saved
    return out.getvalue()


def test_chat_client_whole_and_streamed_give_the_same_reply(server):
    whole = run_client(CHAT_CLIENT, server)
    streamed = run_client(CHAT_CLIENT, server, "--stream")
    text = eval(whole.split("reply: ")[1].split(" finish: ")[0])
    pieces = [eval(line.removeprefix("piece: ")) for line in streamed.splitlines()]
    assert text and len(pieces) > 1 and "".join(pieces) == text, (whole, streamed)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("echo", [False, True])
def test_completion_client_n_logprobs_and_echo(server, stream, echo):
    printed = run_client(COMPLETION_CLIENT, server, *(["--stream"] if stream else []), *(["--echo"] if echo else []))
    rows = [json.loads(line) for line in printed.splitlines()]
    assert {r["index"] for r in rows} == {0, 1}, printed
    for index in (0, 1):
        text = "".join(r["text"] for r in rows if r["index"] == index)
        tokens = [t for r in rows if r["index"] == index for t in r["tokens"]]
        tops = [n for r in rows if r["index"] == index for n in r["tops"]]
        assert text.startswith("Friends, Romans, countrymen,") == echo and "".join(tokens) == text
        assert len(tops) >= 8 and all(n >= 3 for n in tops[-8:]), rows  # per generated token: the sampled one, top 3
    assert [r["finish"] for r in rows if r["finish"]] == ["length", "length"]


@pytest.mark.parametrize("argv", [("--tool-choice", "required"), ("--tool-choice", "required", "--stream"),
                                  ("--tool-choice", "get_current_weather", "--stream")])
def test_tools_client_calls_sends_the_result_back_and_gets_an_answer(server, argv):
    printed = run_client(TOOLS_CLIENT, server, *argv)
    (call,) = [json.loads(line.removeprefix("call: ")) for line in printed.splitlines() if line.startswith("call: ")]
    arguments = json.loads(call["arguments"])
    assert call["name"] == "get_current_weather" and call["id"].startswith("call_"), printed
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    answer = re.search(r"answer: (.*) prompt_tokens: (\d+)", printed)
    assert answer and eval(answer.group(1)), printed
    # the second request's prompt is the chat with the call and its result, rendered by the shipped template
    script = {}
    exec(TOOLS_CLIENT, script)
    turns = script["messages"] + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": call["name"], "arguments": arguments}}]},
        {"role": "tool", "content": script["get_current_weather"](**arguments)}]
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    template = (TEMPLATES / "chatml_tools.jinja").read_text()
    rendered = tokenizer.apply_chat_template(turns, tools=script["tools"], chat_template=template, tokenize=False,
                                             add_generation_prompt=True)
    assert int(answer.group(2)) == len(tokenizer(rendered)["input_ids"])


def test_tools_client_with_auto_reads_no_call_from_a_model_that_writes_none(server):
    printed = run_client(TOOLS_CLIENT, server)
    assert printed.startswith("text: ") and "call: " not in printed, printed


def test_structured_outputs_client(server):
    got = {k: json.loads(v) for k, v in (line.split(": ", 1) for line in run_client(STRUCTURED_CLIENT, server).splitlines())}
    assert got["choice"] in ("good", "bad")
    assert re.fullmatch(r"[a-z]{2,8}@[a-z]{2,8}\.com", got["regex"]), got  # the stop string ends it, left out
    player = json.loads(got["json"])
    assert set(player) == {"name", "lines"} and len(player["name"]) <= 10 and 0 <= player["lines"] <= 999
    assert re.fullmatch(r"SELECT (name|age) FROM (players|plays)", got["grammar"]), got
    assert "I am" in got["structural_tag"], got  # the trigger came: what follows it is constrained
    for tagged in got["structural_tag"].split("I am")[1:]:
        assert re.match(r' in <city>"(Rome|Verona)"</city>', tagged), got


def test_responses_client_text_a_function_call_and_its_output_and_a_stream(server):
    printed = run_client(RESPONSES_CLIENT, server)
    lines = printed.splitlines()
    text, status, tokens = re.fullmatch(r"text: (.*) status: (\w+) tokens: (\d+)", lines[0]).groups()
    text, tokens = eval(text), int(tokens)
    assert text and 0 < tokens <= 12 and status == ("incomplete" if tokens == 12 else "completed"), printed
    asked = re.fullmatch(r'call: function_call get_weather \{"city": "(Rome|Verona)"\} input_tokens: (\d+)', lines[1])
    assert asked and lines[2].startswith("after the call: "), printed
    assert int(lines[2].split("input_tokens: ")[1]) > int(asked.group(2)) + 10  # the call and its output, as turns
    events = [line.split()[1] for line in lines[3:]]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    deltas = [eval(line.split(" ", 2)[2]) for line in lines[3:] if line.split()[1] == "response.output_text.delta"]
    assert "".join(deltas) == text  # the same greedy reply, streamed
