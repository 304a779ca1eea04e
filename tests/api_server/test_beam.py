"""Beam search over the API: vLLM's `use_beam_search` with `n` beams, the hypotheses as choices, best first."""
import httpx
import openai
import pytest

from nano_infer import LLM, BeamSearchParams
from tests.helpers.engine_checks import assert_idle_and_blocks_free, serving

CHAT = [{"role": "user", "content": "To be, or not to be?"}]


@pytest.fixture(scope="module")
def served(qwen2_dir):
    with serving(qwen2_dir, max_num_seqs=8) as pair:
        yield pair


@pytest.fixture(scope="module")
def sync(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32", block_size=4)


def test_completions_and_chat_return_the_beams_best_first(client, model, sync, allm):
    params = BeamSearchParams(3, 10, length_penalty=0.5)
    prompts = ["To be, or not", "The quick brown fox"]
    reply = client.completions.create(model=model, prompt=prompts, n=3, max_tokens=10,
                                      extra_body={"use_beam_search": True, "length_penalty": 0.5})
    expected = sync.beam_search(prompts, params)
    assert [c.index for c in reply.choices] == list(range(6))
    assert [c.text for c in reply.choices] == [s.text for o in expected for s in o.sequences]
    assert reply.usage.completion_tokens == sum(len(s.output_tokens) for o in expected for s in o.sequences)
    chat = client.chat.completions.create(model=model, messages=CHAT, n=2, max_tokens=8,
                                          extra_body={"use_beam_search": True, "early_stopping": True})
    ids = sync.apply_chat_template(CHAT)
    want = sync.beam_search({"prompt_token_ids": ids}, BeamSearchParams(2, 8, early_stopping=True))[0]
    assert [c.message.content for c in chat.choices] == [s.text for s in want.sequences]
    assert [c.finish_reason for c in chat.choices] == [s.finish_reason for s in want.sequences]
    client.completions.create(model=model, prompt="x", max_tokens=1)  # the inbox is FIFO: the beams are done
    assert_idle_and_blocks_free(allm.engine)


@pytest.mark.parametrize("extra, param, message", [
    ({"use_beam_search": True, "stream": True}, "stream", "streaming with beam search is not supported"),
    ({"use_beam_search": True, "seed": 1}, "seed", "a seed has no meaning"),
    ({"use_beam_search": True, "top_p": 0.5}, "top_p", "does not sample"),
    ({"use_beam_search": True, "logprobs": True}, "logprobs", "not returned with beam search"),
    ({"use_beam_search": True, "stop": ["x"]}, "stop", "not supported with beam search"),
    ({"use_beam_search": True, "response_format": {"type": "json_object"}}, "use_beam_search", "constrained output"),
    ({"use_beam_search": True, "n": 9}, "n", "beam_width=9 beams run side by side, but max_num_seqs=8"),
    ({"use_beam_search": True, "early_stopping": "sometimes"}, "early_stopping", "early_stopping"),
    ({"use_beam_search": "yes"}, "use_beam_search", "valid boolean"),
    ({"length_penalty": 2.0}, "length_penalty", "applies to beam search only"),
    ({"early_stopping": True}, "early_stopping", "applies to beam search only"),
])
def test_what_beam_search_cannot_honour_is_a_400_naming_the_field(server, client, model, allm, extra, param, message):
    body = {"model": model, "messages": CHAT, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param, error
    good = client.chat.completions.create(model=model, messages=CHAT, max_tokens=2, n=2,
                                          extra_body={"use_beam_search": True})
    assert len(good.choices) == 2
    assert_idle_and_blocks_free(allm.engine)


def test_the_openai_client_sees_a_bad_request(client, model):
    with pytest.raises(openai.BadRequestError, match="streaming with beam search"):
        client.completions.create(model=model, prompt="x", n=2, max_tokens=4, stream=True,
                                  extra_body={"use_beam_search": True})
