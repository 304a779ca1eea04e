"""The OpenAI-compatible server, driven by the official `openai` client against a real port."""
import asyncio
import json
import random
import time

import httpx
import jsonschema
import openai
import pytest
import regex

import nano_infer.engine.output_processor
import nano_infer.api_server
from nano_infer import LLM, SamplingParams
from nano_infer.async_engine.async_llm import AsyncLLM
from nano_infer.text.byte_level import gpt2_unicode_to_byte
from nano_infer.constrained import json_schema_to_regex
from nano_infer.api_server import BackgroundServer
from nano_infer.api_server.app import sampling_params_from
from nano_infer.api_server.protocol import CompletionBody
from tests.helpers.engine_checks import assert_idle_and_blocks_free, record_aborts

CHAT = [{"role": "user", "content": "To be, or not to be?"}]


@pytest.fixture(scope="module")
def ref(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32")


@pytest.fixture(scope="module")
def allm(qwen2_dir):
    # a small pool: 36 concurrent streams do not fit at once, so some get preempted and resumed
    llm = AsyncLLM(str(qwen2_dir), dtype="float32", block_size=4, num_kv_blocks=128)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def server(allm):
    srv = BackgroundServer(allm)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def model(allm):
    name = allm.stats.model_name
    assert "/" not in name  # a folder's name, never its absolute path
    return name


def greedy(max_tokens):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def wait_until_idle(llm, timeout=30.0):
    """Aborts arrive when the server notices a disconnect; wait for them (a hang guard, not a timing check)."""
    deadline = time.monotonic() + timeout
    while llm.engine.requests:
        assert time.monotonic() < deadline, f"still running: {list(llm.engine.requests)}"
        time.sleep(0.02)


def assert_all_blocks_free(llm, client, model):
    client.completions.create(model=model, prompt="x", max_tokens=1)  # the inbox is FIFO: earlier aborts are done
    assert_idle_and_blocks_free(llm.engine)


def test_models_and_health(server, client, model, allm):
    assert [m.id for m in client.models.list().data] == [model]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    named = BackgroundServer(allm, served_model_name="nano")
    try:
        other = openai.OpenAI(base_url=named.url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in other.models.list().data] == ["nano"]
        assert other.chat.completions.create(model="nano", messages=CHAT, max_tokens=2).choices[0].message.role == "assistant"
        with pytest.raises(openai.NotFoundError):
            other.chat.completions.create(model=model, messages=CHAT, max_tokens=2)
    finally:
        named.stop()


def test_chat_streamed_equals_whole_equals_the_sync_engine(client, model, ref):
    want = ref.chat(CHAT, greedy(20))[0]
    whole = client.chat.completions.create(model=model, messages=CHAT, max_tokens=20, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.choices[0].message.content == want.outputs[0].text
    assert whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(want.prompt_token_ids), 20)

    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=20, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and len(deltas) > 1
    assert "".join(d.content or "" for d in deltas) == want.outputs[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_completion_streamed_equals_whole_with_n_seed_and_top_p(client, model, ref):
    args = dict(model=model, prompt="To be, or not", n=2, temperature=0.8, top_p=0.9, seed=3, max_tokens=12,
                extra_body={"ignore_eos": True})
    want = ref.generate(["To be, or not"], SamplingParams(n=2, temperature=0.8, top_p=0.9, seed=3, max_tokens=12,
                                                          ignore_eos=True))[0].outputs
    whole = client.completions.create(**args)
    assert [c.text for c in sorted(whole.choices, key=lambda c: c.index)] == [o.text for o in want]
    assert whole.usage.completion_tokens == 24
    streamed = {}
    for chunk in client.completions.create(stream=True, **args):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {o.index: o.text for o in want}


def test_stop_string_and_max_tokens(client, model, ref):
    base = ref.generate(["The quick"], greedy(30))[0].outputs[0].text
    stop = base[6:9]
    args = dict(model=model, prompt="The quick", max_tokens=30, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    whole = client.completions.create(**args)
    assert whole.choices[0].text == base[: base.find(stop)] and whole.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in client.completions.create(stream=True, **args)) == base[: base.find(stop)]
    short = client.completions.create(model=model, prompt="The quick", max_tokens=3, extra_body={"ignore_eos": True})
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"


def test_concurrent_streams_with_random_disconnects(server, allm, ref, client, model, monkeypatch):
    rng = random.Random(0)
    aborted = record_aborts(monkeypatch, allm.engine)
    jobs = []  # (chat?, prompt, max_tokens, leave after this many text chunks or None)
    for i in range(36):
        leaves = i % 3 == 0
        prompt = f"Request {i}: to be, or not to be" + " that is the question" * (i % 4)
        jobs.append((i % 2 == 0, prompt, 200 if leaves else rng.randint(8, 24), rng.randint(1, 5) if leaves else None))
    stayers = [j for j in jobs if j[3] is None]
    ids = [ref.apply_chat_template([{"role": "user", "content": p}]) if chat else ref.tokenizer.encode(p)
           for chat, p, _, _ in stayers]
    want = [o.outputs[0].text for o in ref.generate(prompt_token_ids=ids, sampling_params=[greedy(n) for _, _, n, _ in stayers])]

    async def one(aclient, chat, prompt, max_tokens, leave_after):
        common = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True, extra_body={"ignore_eos": True})
        if chat:
            stream = await aclient.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
        else:
            stream = await aclient.completions.create(prompt=prompt, **common)
        text, finish, request_id, pieces = "", None, None, 0
        async for chunk in stream:
            request_id = chunk.id
            c = chunk.choices[0]
            text += (c.delta.content or "") if chat else c.text
            finish = c.finish_reason or finish
            pieces += 1
            if leave_after is not None and pieces >= leave_after:
                break
        await stream.close()  # drops the connection: the server must notice and abort
        return text, finish, request_id

    async def all_clients():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as aclient:
            return await asyncio.gather(*(one(aclient, *job) for job in jobs))

    results = asyncio.run(all_clients())
    got = [(text, finish) for (text, finish, _), job in zip(results, jobs) if job[3] is None]
    assert got == [(w, "length") for w in want]
    wait_until_idle(allm)
    left_running = {rid for (_, finish, rid), job in zip(results, jobs) if job[3] is not None and finish is None}
    assert left_running and left_running <= {o.request_id for o in aborted if o is not None}
    assert all(len(o.outputs[0].token_ids) < 200 for o in aborted if o is not None)
    assert_all_blocks_free(allm, client, model)


BAD_REQUESTS = [  # (path, body, status, message contains, param)
    ("chat", b'{"model": "m", "messages": [', 400, "not valid JSON", None),
    ("chat", {}, 400, "messages: Field required", "messages"),
    ("chat", {"messages": []}, 400, "at least 1 item", "messages"),
    ("chat", {"messages": "hello"}, 400, "valid list", "messages"),
    ("chat", {"messages": [{"content": "no role"}]}, 400, "messages.0.role: Field required", "messages"),
    ("chat", {"model": "gpt-4o", "messages": CHAT}, 404, "`gpt-4o` does not exist", "model"),
    ("completions", {"prompt": [5] * 512}, 400, "the limit is max_model_len - 1 = 511", "prompt"),  # max_tokens: capped
    ("completions", {"prompt": [5] * 512, "stream": True}, 400, "the limit is max_model_len - 1 = 511", "prompt"),
    ("chat", {"messages": CHAT, "max_tokens": "many"}, 400, "max_tokens: Input should be a valid integer", "max_tokens"),
    ("chat", {"messages": CHAT, "temperature": "hot"}, 400, "temperature: Input should be a valid number", "temperature"),
    ("chat", {"messages": CHAT, "temperature": -1}, 400, "greater than or equal to 0", "temperature"),
    ("chat", {"messages": CHAT, "top_p": 1.5}, 400, "less than or equal to 1", "top_p"),
    ("chat", {"messages": CHAT, "n": 0}, 400, "n: Input should be greater than or equal to 1", "n"),
    ("chat", {"messages": CHAT, "stop": [1]}, 400, "stop", "stop"),
    ("chat", {"messages": CHAT, "response_format": {"type": "json_schema"}}, 400, "needs a 'json_schema'", "response_format"),
    ("chat", [1, 2], 400, "must be a JSON object", None),
    ("completions", {"max_tokens": 4}, 400, "prompt: Field required", "prompt"),
    ("completions", {"prompt": ""}, 400, "non-empty", None),
    ("completions", {"prompt": [5, 10**6]}, 400, "[0, ", None),
    ("completions", {"prompt": [["one"]]}, 400, "prompt", "prompt"),
    ("completions", {"prompt": "x", "max_tokens": 0}, 400, "echo: true only", "max_tokens"),
]


@pytest.mark.parametrize("path,body,status,message,param", BAD_REQUESTS)
def test_bad_request_gets_an_openai_error_and_the_server_keeps_serving(server, client, model, path, body, status,
                                                                       message, param):
    url = server.url + ("/v1/chat/completions" if path == "chat" else "/v1/completions")
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param
    assert error["type"] == "invalid_request_error" and set(error) == {"message", "type", "param", "code"}
    good = client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, extra_body={"ignore_eos": True})
    assert good.usage.completion_tokens == 2


def test_the_openai_client_raises_its_own_exceptions(client, model):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        client.completions.create(model=model, prompt=[5] * 600, max_tokens=1, stream=True)


def test_max_tokens_beyond_the_context_is_capped_at_what_the_prompt_leaves_as_vllm_does(client, model):
    """vLLM's server takes min(max_tokens, max_model_len - prompt tokens): a reply that reaches the end of the
    context finishes with "length"; only a prompt that leaves no room is refused."""
    out = client.completions.create(model=model, prompt=[5] * 508, max_tokens=10**6, extra_body={"ignore_eos": True})
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.choices[0].finish_reason) == (508, 4, "length")


def test_a_client_that_leaves_a_non_streamed_request_aborts_it(server, allm, client, model, monkeypatch):
    aborted = record_aborts(monkeypatch, allm.engine)

    async def leave_while_running():
        async with httpx.AsyncClient() as http:
            body = {"model": model, "messages": CHAT, "max_tokens": 480, "ignore_eos": True}
            task = asyncio.create_task(http.post(server.url + "/v1/chat/completions", json=body))
            while not allm.engine.requests:
                await asyncio.sleep(0.01)
            task.cancel()  # closes the connection mid-request

    asyncio.run(leave_while_running())
    wait_until_idle(allm)
    assert len(aborted) == 1 and len(aborted[0].outputs[0].token_ids) < 480
    assert_all_blocks_free(allm, client, model)


def test_text_split_mid_character_streams_whole_characters(client, model, tokenizer, monkeypatch):
    """English, Chinese and emoji, forced out one UTF-8 byte per token: every delta is whole characters."""
    text = "To be 你好，世界！ 🙂🚀 café"
    byte_token = {b: tokenizer.convert_tokens_to_ids(c) for c, b in gpt2_unicode_to_byte().items()}
    forced = [byte_token[b] for b in text.encode("utf-8")]
    monkeypatch.setattr(nano_infer.engine.output_processor, "sample", lambda logits, seqs, *_: [forced[s.num_output_tokens] for s in seqs])
    args = dict(model=model, prompt="x", max_tokens=len(forced), temperature=0)
    deltas = [c.choices[0].text for c in client.completions.create(stream=True, **args)]
    assert all("\ufffd" not in d for d in deltas) and "".join(deltas) == text
    assert len(deltas) < len(forced)  # bytes of one character were held back, then sent together
    assert client.completions.create(**args).choices[0].text == text


def test_response_format_json_schema_constrains_the_reply(client, model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["merry", "sad"]}},
              "required": ["ok", "mood"]}
    args = dict(model=model, messages=CHAT, max_tokens=40,
                response_format={"type": "json_schema", "json_schema": {"name": "mood", "schema": schema}})
    whole = client.chat.completions.create(**args)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args) if c.choices)
    for text in (whole.choices[0].message.content, streamed):
        jsonschema.validate(json.loads(text), schema)
    assert whole.choices[0].finish_reason == "stop"


@pytest.mark.slow
def test_response_format_json_object_gives_an_object(client, model):
    """Any JSON object: the random-weight model may not close it within max_tokens, but what it writes is one."""
    reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=60, temperature=0,
                                           response_format={"type": "json_object"}).choices[0]
    text = reply.message.content
    # the `regex` package's partial match, not chapter 07's DFA that made the text: an object so far
    assert text.startswith("{") and regex.fullmatch(json_schema_to_regex({"type": "object"}), text, partial=True)
    assert reply.finish_reason in ("stop", "length")
    if reply.finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_response_format_becomes_a_json_schema_constraint():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    body = CompletionBody(prompt="x", response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    assert sampling_params_from(body, 8).json_schema == schema
    assert sampling_params_from(CompletionBody(prompt="x", response_format={"type": "json_object"}), 8).json_schema == {"type": "object"}
    assert sampling_params_from(CompletionBody(prompt="x", response_format={"type": "text"}), 8).json_schema is None


def test_nano_infer_serve_command(qwen2_dir, tmp_path, monkeypatch, capsys):
    """`nano-infer serve` builds the engine from its options and serves it; uvicorn runs in a thread here."""
    from nano_infer.cli.main import main

    seen = {}

    def serve_briefly(llm, host, port, served_model_name, log_level, api_key, allowed_hosts, limits, sock, admin_key,
                      metrics_public):
        seen["metrics"] = admin_key, metrics_public
        seen["bound"] = sock.getsockname()  # the port taken before the model loaded
        seen["pace"], seen["backlog"] = limits.body_bytes_per_s, llm._tokenizer_thread.max_backlog
        sock.close()
        server = BackgroundServer(llm, host, port, served_model_name, api_key=api_key, allowed_hosts=allowed_hosts,
                                  limits=limits)
        try:
            c = openai.OpenAI(base_url=server.url + "/v1", api_key="secret", max_retries=0)
            seen["models"] = [m.id for m in c.models.list().data]
            seen["usage"] = c.completions.create(model="tiny", prompt="To be", max_tokens=3,
                                                 extra_body={"ignore_eos": True}).usage.completion_tokens
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
            seen["no key"] = httpx.get(server.url + "/v1/models").status_code
            seen["health"] = httpx.get(server.url + "/health").status_code  # probes need no key
            seen["rebinding"] = httpx.get(server.url + "/health", headers={"host": "evil.example:80"}).status_code
            seen["named host"] = httpx.get(server.url + "/health", headers={"host": "box.lan:80"}).status_code
            seen["big body"] = httpx.post(server.url + "/v1/completions", content=b"x" * 2000).status_code
        finally:
            server.stop()
        seen.update(llm=llm, block_size=llm.engine.kv.block_size, max_num_seqs=llm.engine.scheduler.max_num_seqs)
        return True  # run_server's answer: it stopped for a signal, not for a dead engine

    monkeypatch.setattr(nano_infer.api_server, "run_server", serve_briefly)
    monkeypatch.setenv("NANO_INFER_API_KEY", "secret")
    monkeypatch.setenv("NANO_INFER_ADMIN_KEY", "operator")
    assert main(["serve", "--model", str(qwen2_dir), "--port", "0", "--served-model-name", "tiny",
                 "--block-size", "8", "--max-num-seqs", "5", "--allowed-host", "box.lan", "--max-request-bytes", "1000",
                 "--max-request-bytes-per-second", "500000", "--max-tokenize-backlog", "7"]) == 0
    assert (seen["pace"], seen["backlog"], seen["metrics"]) == (500_000, 7, ("operator", False))
    assert seen["bound"][0] == "127.0.0.1" and seen["bound"][1] > 0
    assert seen["models"] == ["tiny"] and seen["usage"] == 3
    assert (seen["block_size"], seen["max_num_seqs"]) == (8, 5)
    assert (seen["no key"], seen["health"], seen["rebinding"], seen["named host"], seen["big body"]) == (401, 200, 400, 200, 413)
    assert not seen["llm"].is_running  # shut down when the server stops
    assert main(["serve", "--model", str(tmp_path / "no-such-model"), "--port", "0"]) == 2
    assert "neither a local folder nor a hub id" in capsys.readouterr().err
    assert main(["serve", "--model", str(qwen2_dir), "--port", "0", "--admin-key", "secret"]) == 2  # a tenant's key
    assert "--admin-key must be non-empty and differ from every --api-key" in capsys.readouterr().err


def test_a_gguf_file_is_served_under_its_own_name(tmp_path):
    """Not its folder's (`models` for a pip-installed checkpoint): the file names the quantization too."""
    from nano_infer.engine.build import display_name

    (tmp_path / "SmolLM2-135M-Instruct-Q4_1.gguf").write_bytes(b"")
    for model in (str(tmp_path / "SmolLM2-135M-Instruct-Q4_1.gguf"), str(tmp_path)):
        assert display_name(model, tmp_path, "SmolLM2-135M-Instruct-Q4_1.gguf") == "SmolLM2-135M-Instruct-Q4_1.gguf"
    assert display_name(str(tmp_path), tmp_path, None) == tmp_path.name
    assert display_name("Qwen/Qwen2.5-0.5B-Instruct", tmp_path, None) == "Qwen/Qwen2.5-0.5B-Instruct"
