"""The server's request protocol: vLLM's constraint fields, logprobs, echo, refusals that name the field, /metrics."""
import json
import re

import httpx
import openai
import pytest

from nano_infer import LLM, SamplingParams
from tests.helpers.engine_checks import ADMIN_KEY, metrics_text, serving

CHAT = [{"role": "user", "content": "To be, or not to be?"}]


@pytest.fixture(scope="module")
def served(qwen2_dir):
    with serving(qwen2_dir) as both:
        yield both


@pytest.mark.parametrize("extra,check", [
    ({"guided_regex": "(yes|no)-[0-9]{3}"}, lambda t: re.fullmatch("(yes|no)-[0-9]{3}", t)),
    ({"guided_choice": ["Hamlet", "Ophelia"]}, lambda t: t in ("Hamlet", "Ophelia")),
    ({"guided_json": {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"]}},
     lambda t: json.loads(t)["n"] in (1, 2, 3)),
    ({"guided_json": json.dumps({"type": "array", "items": {"type": "boolean"}, "maxItems": 3})},
     lambda t: all(isinstance(x, bool) for x in json.loads(t))),
    ({"structured_outputs": {"regex": "[A-Z]{2}"}}, lambda t: re.fullmatch("[A-Z]{2}", t)),
    ({"structured_outputs": {"choice": ["to be", "not"]}}, lambda t: t in ("to be", "not")),
    ({"structured_outputs": {"json": {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}}},
     lambda t: isinstance(json.loads(t)["b"], bool)),
    ({"guided_regex": r"[\u4e00-\u9fff]{2,3}"}, lambda t: re.fullmatch(r"[\u4e00-\u9fff]{2,3}", t)),
])
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_vllm_constraint_fields_constrain(client, model, extra, check, temperature):
    reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=32, temperature=temperature, seed=1,
                                           extra_body=extra)
    text = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop" and check(text), text


@pytest.mark.parametrize("extra,param", [
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"logit_bias": {"three": 1}}, "logit_bias"),
    ({"min_tokens": 9}, "min_tokens"),  # more than max_tokens
    ({"use_beam_search": True, "n": 2, "presence_penalty": 0.5}, "presence_penalty"),
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"whatever": 1}, "whatever"),
    ({"seed": 2**64}, "seed"),
    ({"n": True}, "n"),
])
def test_what_the_server_does_not_do_is_refused_by_name(client, model, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, extra_body=extra)
    assert e.value.body["param"] == param, e.value.body


def test_neutral_values_and_fields_that_change_nothing_are_accepted(client, model, caplog):
    with caplog.at_level("INFO", logger="nano_infer.api_server.sampling"):
        reply = client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=3, frequency_penalty=0, presence_penalty=0, logit_bias={}, user="u1",
            tools=[], tool_choice="none", store=False, metadata={"k": "v"}, service_tier="auto",
            parallel_tool_calls=True)
    assert reply.choices[0].message.content is not None
    assert "store, metadata, service_tier, parallel_tool_calls, user" in caplog.text


def test_sampling_knobs_reach_the_engine(client, model, qwen2_dir):
    """The server's penalties, logit_bias, bad_words and min_tokens give what the engine gives for them."""
    knobs = dict(repetition_penalty=1.8, presence_penalty=0.5, frequency_penalty=0.3, min_p=0.05, min_tokens=3,
                 bad_words=["the"], allowed_token_ids=list(range(3, 400)), include_stop_str_in_output=True)
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4)
    first = llm.generate(prompt_token_ids=[llm.apply_chat_template(CHAT)], sampling_params=SamplingParams(
        temperature=0, max_tokens=8))[0].outputs[0].token_ids[0]
    bias = {first: -100.0, 7: 5.0}
    ref = llm.generate(prompt_token_ids=[llm.apply_chat_template(CHAT)], sampling_params=SamplingParams(
        temperature=0, max_tokens=8, logit_bias=bias, **knobs))[0].outputs[0].text
    reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0,
                                           presence_penalty=0.5, frequency_penalty=0.3,
                                           logit_bias={str(k): v for k, v in bias.items()}, extra_body={
                                               k: v for k, v in knobs.items() if "_penalty" not in k or k[0] == "r"})
    assert reply.choices[0].message.content == ref


def test_chat_logprobs_equal_the_engine_and_stream_the_same(client, model, qwen2_dir):
    ask = dict(model=model, messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
               extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**ask).choices[0].logprobs.content
    chunks = [c.choices[0].logprobs.content for c in client.chat.completions.create(**ask, stream=True)
              if c.choices and c.choices[0].logprobs]
    streamed = [e for chunk in chunks for e in chunk]
    assert [(e.token, e.logprob) for e in whole] == [(e.token, e.logprob) for e in streamed] and len(whole) == 6
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4)
    ids = llm.apply_chat_template(CHAT)
    ref = llm.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, logprobs=2))[0].outputs[0]
    for e, token, entry in zip(whole, ref.token_ids, ref.logprobs):
        assert e.logprob == pytest.approx(entry[token].logprob, abs=1e-5)
        assert bytes(e.bytes) == llm.engine.vocabulary.token_bytes[token]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(
            [lp.logprob for lp in sorted(entry.values(), key=lambda lp: lp.rank)][:2], abs=1e-5)


def test_completion_logprobs_and_echo(client, model):
    out = client.completions.create(model=model, prompt="To be", max_tokens=4, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True}).choices[0]
    lp = out.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == out.text and lp.text_offset[0] == 0
    assert all(max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs, lp.token_logprobs))  # greedy
    echoed = client.completions.create(model=model, prompt="To be", max_tokens=4, temperature=0, echo=True,
                                       extra_body={"ignore_eos": True}).choices[0].text
    assert echoed == "To be" + out.text


def test_metrics_in_prometheus_format(server, client, model):
    client.chat.completions.create(model=model, messages=CHAT, max_tokens=5, extra_body={"ignore_eos": True})
    text = metrics_text(server.url)
    values = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(nano_infer_\w+)\{[^}]*\} (\S+)$", text, re.M)}
    assert values["nano_infer_num_requests_running"] == 0 and values["nano_infer_num_requests_waiting"] == 0
    assert values["nano_infer_generation_tokens_total"] >= 5
    assert values["nano_infer_kv_blocks_used"] + values["nano_infer_kv_blocks_free"] == values["nano_infer_kv_blocks_total"]
    assert 0 <= values["nano_infer_prefix_cache_hit_rate"] <= 1
    assert "# TYPE nano_infer_generation_tokens_total counter" in text


def test_metrics_answer_the_admin_key_only(server, allm):
    """Its counters move with every tenant's requests: a tenant reading them beside another's request reads
    that request's prompt length. So a key other than the admin's (or none) gets 401, and a server started
    without an admin key answers 403 saying how to serve them; `metrics_public` serves them to anyone."""
    from nano_infer.api_server import BackgroundServer

    for headers in ({}, {"authorization": "Bearer tenant-key"}, {"authorization": f"Basic {ADMIN_KEY}"},
                    {"authorization": f"Bearer {ADMIN_KEY}x"}):
        r = httpx.get(server.url + "/metrics", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (headers, r.text)
    assert "nano_infer_generation_tokens_total" in metrics_text(server.url)
    for options, status in (({}, 403), ({"metrics_public": True}, 200), ({"admin_key": "a", "metrics_public": True}, 200)):
        other = BackgroundServer(allm, **options)
        try:
            r = httpx.get(other.url + "/metrics")
        finally:
            other.stop()
        assert r.status_code == status, (options, r.text)
        assert status == 200 or "--metrics-public" in r.json()["error"]["message"]
    with pytest.raises(ValueError, match="admin key"):
        BackgroundServer(allm, api_key=("k1", "k2"), admin_key="k2")


def test_errors_never_reveal_the_model_path(server, allm):
    folder = str(allm.engine.model_dir)
    for r in (httpx.post(server.url + "/v1/chat/completions", json={"model": "nope", "messages": CHAT}),
              httpx.get(server.url + "/v1/nothing"), httpx.get(server.url + "/v1/models")):
        assert folder not in r.text and r.status_code in (200, 404)
