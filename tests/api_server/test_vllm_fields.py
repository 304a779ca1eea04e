"""vLLM's request fields and routes that client code sends: each with vLLM's meaning, or accepted at its neutral value
and refused (400 naming it) otherwise."""
from copy import deepcopy
from types import SimpleNamespace

import httpx
import pytest

from nano_infer import LLM
from nano_infer.api_server.protocol import ChatBody
from nano_infer.api_server.tools import chat_messages
from tests.helpers.engine_checks import serving

CHAT = [{"role": "user", "content": "To be, or not to be?"}]


@pytest.fixture(scope="module")
def served(qwen2_dir):
    with serving(qwen2_dir) as both:
        yield both


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def rendered(tokenizer, template: str, body: dict) -> str:
    """What `template` renders for a chat body, through the server's own path to the template."""
    tok = deepcopy(tokenizer)
    tok.chat_template = template
    return tok.decode(LLM.apply_chat_template(SimpleNamespace(tokenizer=tok), chat_messages(ChatBody.model_validate(body))))


def test_name_chat_template_kwargs_and_the_generation_prompt_reach_the_template(tokenizer):
    template = ("{% for m in messages %}{{ m.role }}{% if m.name %}({{ m.name }}){% endif %}: {{ m.content }}\n"
                "{% endfor %}{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    messages = CHAT + [{"role": "tool", "name": "get_weather", "tool_call_id": "c", "content": "sunny"}]
    text = rendered(tokenizer, template, {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}})
    assert "tool(get_weather): sunny" in text and text.endswith("/no_thinkassistant:"), text
    assert not rendered(tokenizer, template, {"messages": CHAT, "add_generation_prompt": False}).endswith("assistant:")


def test_continue_final_message_leaves_the_assistants_turn_open(served, tokenizer):
    llm, server = served
    start = [*CHAT, {"role": "assistant", "content": "To be"}]
    body = {"messages": start, "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 4,
            "temperature": 0, "ignore_eos": True}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    closed = llm.apply_chat_template(start, add_generation_prompt=False)
    assert r.json()["usage"]["prompt_tokens"] < len(closed)  # the turn's end is not rendered
    for wrong in ({"continue_final_message": True}, {"messages": CHAT, "add_generation_prompt": False,
                                                     "continue_final_message": True}):
        r = post(server, "/v1/chat/completions", {**body, "add_generation_prompt": True, **wrong})
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text


def test_neutral_values_pass_and_others_name_their_field(served):
    llm, server = served
    chat = {"messages": CHAT, "max_tokens": 2}
    neutral = {"echo": False, "chat_template": None, "documents": None, "add_special_tokens": False,
               "spaces_between_special_tokens": True, "truncate_prompt_tokens": None, "request_id": "mine-1",
               "chat_template_kwargs": {"enable_thinking": False}}
    r = post(server, "/v1/chat/completions", {**chat, **neutral})
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-mine-1", r.text
    for field, value in (("echo", True), ("add_special_tokens", True), ("spaces_between_special_tokens", False),
                         ("truncate_prompt_tokens", 8), ("documents", [{"text": "x"}]),
                         ("chat_template_kwargs", {"tokenize": False})):
        r = post(server, "/v1/chat/completions", {**chat, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    r = post(server, "/v1/completions", {"prompt": "To be", "max_tokens": 2, "add_special_tokens": True, "echo": False})
    assert r.status_code == 200, r.text


def test_return_tokens_as_token_ids(served):
    llm, server = served
    body = {"prompt": "To be", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logprobs": 2,
            "return_tokens_as_token_ids": True}
    choice = post(server, "/v1/completions", body).json()["choices"][0]
    plain = post(server, "/v1/completions", {**body, "return_tokens_as_token_ids": False}).json()["choices"][0]
    ids = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
    assert llm.tokenizer.decode(ids) == plain["text"] == choice["text"]
    assert all(key.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"] for key in top)


def test_tokenize_detokenize_and_version(served):
    llm, server = served
    r = post(server, "/tokenize", {"prompt": "To be, or not", "return_token_strs": True}).json()
    assert r["tokens"] == llm.engine.encode("To be, or not") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == llm.stats.max_model_len and r["token_strs"] == llm.tokenizer.convert_ids_to_tokens(r["tokens"])
    chat = post(server, "/tokenize", {"messages": CHAT}).json()
    assert chat["tokens"] == llm.apply_chat_template(CHAT) and chat["token_strs"] is None
    assert post(server, "/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": "To be, or not"}
    for path, body, param in (("/detokenize", {"tokens": [10**6]}, "tokens"),
                              ("/tokenize", {"prompt": "x", "messages": CHAT}, "prompt"),
                              ("/tokenize", {"prompt": "x", "model": "other"}, "model")):
        r = post(server, path, body)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text
    assert httpx.get(server.url + "/version").json()["version"]


def test_tokenize_needs_the_api_key(served):
    from nano_infer.api_server import BackgroundServer

    llm, _ = served
    keyed = BackgroundServer(llm, api_key="secret")
    try:
        assert post(keyed, "/tokenize", {"prompt": "x"}).status_code == 401
        assert post(keyed, "/detokenize", {"tokens": [5]}).status_code == 401
        assert post(keyed, "/tokenize", {"prompt": "x"}, headers={"authorization": "Bearer secret"}).status_code == 200
    finally:
        keyed.stop()


def test_a_full_tokenizer_backlog_is_a_429_on_every_route(served, monkeypatch):
    """The tenant's queue for the tokenizer full, wherever a route meets it: 429 with Retry-After, OpenAI's body."""
    from nano_infer.async_engine.fair_queue import TenantBacklogFull

    llm, server = served

    async def full(*args, **kwargs):
        raise TenantBacklogFull("1,024 items of yours are queued")

    monkeypatch.setattr(llm, "encode", full)
    for path, body in (("/tokenize", {"prompt": "x"}), ("/v1/chat/completions", {"messages": CHAT}),
                       ("/v1/chat/completions", {"messages": CHAT, "stream": True})):
        r = post(server, path, body)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", (path, r.text)
        assert r.json()["error"]["type"] == "rate_limit_error", r.text



def test_a_reply_sent_back_as_the_sdk_dumps_it_is_taken(served):
    """openai's ChatCompletionMessage.model_dump() adds refusal, annotations, audio and function_call (null): vLLM
    takes them, and so does this server; a value in one of them is still refused by name."""
    from openai.types.chat import ChatCompletion

    _, server = served
    first = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3})
    assert first.status_code == 200, first.text
    reply = ChatCompletion.model_validate(first.json()).choices[0].message.model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= set(reply)
    again = post(server, "/v1/chat/completions", {"messages": [*CHAT, reply, *CHAT], "max_tokens": 3})
    assert again.status_code == 200, again.text
    bad = post(server, "/v1/chat/completions", {"messages": [*CHAT, dict(reply, refusal="no")], "max_tokens": 3})
    assert bad.status_code == 400 and "refusal" in bad.text, bad.text
