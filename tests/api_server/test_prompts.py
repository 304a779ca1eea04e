"""/v1/completions with several prompts in every OpenAI form, and echo with logprobs (the prompt's logprobs)."""
import asyncio
import json
import time

import httpx
import pytest
import torch

from nano_infer import LLM, SamplingParams
from nano_infer.api_server.protocol import MAX_CHOICES
from tests.helpers.engine_checks import assert_idle_and_blocks_free, record_aborts, serving
from tests.helpers.model_factory import hf_model

ATOL = 1e-4
TEXTS = ["To be, or not to be", "The quick brown fox", "你好，世界！", "def f(x): return"]


@pytest.fixture(scope="module")
def served(qwen2_dir):
    with serving(qwen2_dir) as both:
        yield both


@pytest.fixture(scope="module")
def ref(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32", block_size=4)


@pytest.fixture(scope="module")
def hf(qwen2_dir):
    return hf_model(qwen2_dir)


def post(server, body):
    return httpx.post(server.url + "/v1/completions", json=body, timeout=60)


def idle(allm, server):
    """Every request of the server done or aborted, and every KV block free or only cached."""
    deadline = time.monotonic() + 30
    while allm.engine.requests:
        assert time.monotonic() < deadline, f"still running: {list(allm.engine.requests)}"
        time.sleep(0.02)
    post(server, {"prompt": "x", "max_tokens": 1})  # the inbox is FIFO: earlier aborts are done
    assert_idle_and_blocks_free(allm.engine)


@pytest.mark.parametrize("form", ["string", "strings", "token ids", "token-id lists"])
def test_every_prompt_form_with_n_gives_openai_choices(client, model, ref, tokenizer, form):
    ids = [tokenizer.encode(t) for t in TEXTS]
    prompt = {"string": TEXTS[0], "strings": TEXTS, "token ids": ids[0], "token-id lists": ids}[form]
    count = 1 if form in ("string", "token ids") else len(TEXTS)
    params = dict(n=2, temperature=0.8, seed=5, max_tokens=6)
    want = ref.generate(prompt_token_ids=ids[:count], sampling_params=SamplingParams(ignore_eos=True, **params))
    reply = client.completions.create(model=model, prompt=prompt, extra_body={"ignore_eos": True}, **params)
    assert sorted(c.index for c in reply.choices) == list(range(2 * count))
    by_index = {c.index: c.text for c in reply.choices}
    assert [by_index[2 * i + j] for i in range(count) for j in range(2)] == [o.text for w in want for o in w.outputs]
    assert reply.usage.prompt_tokens == sum(map(len, ids[:count])) and reply.usage.completion_tokens == 12 * count
    streamed = {}
    for chunk in client.completions.create(model=model, prompt=prompt, stream=True, extra_body={"ignore_eos": True},
                                           **params):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == by_index


def test_the_prompts_of_one_request_share_steps(allm, client, model, monkeypatch):
    scheduler, batches = allm.engine.scheduler, []
    schedule = scheduler.schedule

    def recording():
        out = schedule()
        batches.append({e.seq.request_id for e in out.scheduled})
        return out

    monkeypatch.setattr(scheduler, "schedule", recording)
    reply = client.completions.create(model=model, prompt=TEXTS, max_tokens=32, extra_body={"ignore_eos": True})
    assert len(reply.choices) == len(TEXTS)
    assert max(len(b) for b in batches) == len(TEXTS)  # all four in one forward pass


def test_echo_with_logprobs_scores_the_prompt_as_transformers(server, tokenizer, hf, model):
    """What lm-eval sends for each multiple-choice option, in its default (token ids) form."""
    ids = [tokenizer.encode(t) for t in TEXTS]
    body = {"model": model, "prompt": ids, "temperature": 0, "max_tokens": 1, "logprobs": 2, "seed": 1234, "echo": True}
    reply = post(server, body).json()
    worst = 0.0
    for choice, p in zip(sorted(reply["choices"], key=lambda c: c["index"]), ids):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(p) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing before the first token
        assert choice["text"].startswith(tokenizer.decode(p)) and lp["text_offset"][0] == 0
        with torch.no_grad():
            want = hf(torch.tensor([p])).logits[0].float().log_softmax(-1)
        for pos, (token, got, top) in enumerate(zip(p[1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:])):
            worst = max(worst, abs(got - want[pos, token].item()))
            best = want[pos].topk(2)
            assert sorted(top.values(), reverse=True)[:2] == pytest.approx(best.values.tolist(), abs=ATOL)
            assert (max(top.values()) == got) == (want[pos].argmax().item() == token)  # lm-eval's is_greedy
        assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())  # the greedy completion token
    assert worst < ATOL, worst
    assert reply["usage"] == {"prompt_tokens": sum(map(len, ids)), "completion_tokens": len(ids),
                              "total_tokens": sum(map(len, ids)) + len(ids),
                              "prompt_tokens_details": {"cached_tokens": 0}}  # prompt logprobs take no cache hit

    def same_scores(got, p, choice):  # another pass, maybe batched otherwise: equal up to float rounding
        want = choice["logprobs"]["token_logprobs"][1 : len(p)]
        assert got["tokens"][: len(p)] == choice["logprobs"]["tokens"][: len(p)] and got["token_logprobs"][0] is None
        assert got["token_logprobs"][1 : len(p)] == pytest.approx(want, abs=1e-5)

    echo_only = post(server, {**body, "max_tokens": 0}).json()
    for full, bare, p in zip(reply["choices"], echo_only["choices"], ids):
        assert bare["text"] == tokenizer.decode(p) and bare["finish_reason"] == "length"
        assert len(bare["logprobs"]["tokens"]) == len(p)
        same_scores(bare["logprobs"], p, full)
    assert echo_only["usage"]["completion_tokens"] == 0
    streamed = [json.loads(line[6:]) for line in httpx.post(
        server.url + "/v1/completions", json={**body, "prompt": ids[0], "stream": True}).text.splitlines()
        if line.startswith("data: {")]
    same_scores(streamed[0]["choices"][0]["logprobs"], ids[0], reply["choices"][0])


@pytest.mark.parametrize("body,message,param", [
    ({"prompt": []}, "at least one prompt", "prompt"),
    ({"prompt": [[5]] * 3, "n": 100}, "choices", "prompt"),
    ({"prompt": [[5]] * (MAX_CHOICES + 1)}, "choices", "prompt"),
    ({"prompt": "To be", "max_tokens": 0}, "echo", "max_tokens"),
    ({"prompt": [list(range(5, 405))], "echo": True, "logprobs": 20, "n": 128, "max_tokens": 4}, "could carry",
     "logprobs"),
    ({"prompt": [[5, 6], [5, 10**6]]}, "prompt 1: prompt_token_ids", None),
    ({"prompt": [[5, 6], []], "stream": True}, "prompt 1: prompt is empty", None),
    ({"prompt": [[5], "x"]}, "prompt", "prompt"),
])
def test_bad_prompts_are_refused_by_name_and_run_nothing(allm, server, body, message, param):
    r = post(server, {"max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and r.json()["error"]["param"] == param, r.text
    idle(allm, server)


def test_a_client_that_leaves_aborts_every_prompt(allm, server, model, monkeypatch):
    aborted = record_aborts(monkeypatch, allm.engine)

    async def leave_while_running():
        async with httpx.AsyncClient() as http:
            body = {"model": model, "prompt": TEXTS[:3], "max_tokens": 400, "ignore_eos": True}
            task = asyncio.create_task(http.post(server.url + "/v1/completions", json=body))
            while len(allm.engine.requests) < 3:
                await asyncio.sleep(0.01)
            task.cancel()

    asyncio.run(leave_while_running())
    idle(allm, server)
    assert len([o for o in aborted if o is not None]) == 3
    assert all(len(o.outputs[0].token_ids) < 400 for o in aborted if o is not None)
