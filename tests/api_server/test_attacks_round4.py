"""Round 4 (issue 53): the event loop, the tokenizer, a step's prefill budget and the stream buffers, two tenants.

Each attack floods from the attacker's key while the victim's first tokens are timed; the bound is
relative to a control load (the same loops without the suspect field) measured in the same run.
"""
import json
import time

import pytest

from tests.helpers.attacks import (ATTACKER, Flood, as_attacker, chat, encoded, settle, two_tenants,
                                   victim_first_tokens)

pytestmark = pytest.mark.slow  # live servers under load
FLOOR_S = 0.5  # a victim's first token this fast is not slowed, whatever the ratio (scheduler noise on a shared machine)


# Qwen2.5's way with tools: each one written into the system turn as JSON, in full
TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
                  "\n</tools><|im_end|>\n{% endif %}"
                  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tenants(tokenizer, tmp_path_factory):
    """Two tenants on a model eight times the test model's width and twice its depth (a prompt step costs what a
    small real model's does, so a queue of prefills is seen), its chat template rendering tools as Qwen2.5's."""
    import copy

    from tests.helpers.model_factory import make_padded_vocab_dir

    tools_tokenizer = copy.deepcopy(tokenizer)
    tools_tokenizer.chat_template = TOOLS_TEMPLATE
    folder = make_padded_vocab_dir(tmp_path_factory.mktemp("round4"), tools_tokenizer, len(tokenizer), hidden_size=512,
                                   intermediate_size=1536, num_hidden_layers=4, max_position_embeddings=2048)
    with two_tenants(folder, max_num_seqs=128, max_num_batched_tokens=256) as both:  # a tenant holds 42 seats
        yield both


def slowdown_beside(url, path, attack: bytes, control: bytes, loops: int) -> tuple[float, float, Flood]:
    """(victim's slowest first token under `control`, under `attack`, the attack's flood), each flood `loops` threads."""
    with Flood(url, path, control, loops):
        calm = victim_first_tokens(url)
    with Flood(url, path, attack, loops) as flood:
        attacked = victim_first_tokens(url)
    print(f"\n{path}: victim's first token {calm:.3f} s under the control load, {attacked:.3f} s under the attack")
    return calm, attacked, flood


def test_28_json_inside_fields_is_read_off_the_event_loop(tenants):
    """A schema sent as a string of 400,000 enum members, and a tool call whose arguments are 400,000 numbers:
    each is read (and refused, or its chat run) in the attacker's worker turn, not on the loop that every
    victim chunk passes through."""
    llm, server = tenants
    big = "[" + ",".join(["0"] * 400_000) + "]"
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": big}}
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "x"}]
    for attack in (chat(guided_json='{"enum": ' + big + "}"), chat(messages=turn, max_tokens=1)):
        r = as_attacker(server.url, "/v1/chat/completions", attack)
        assert r.status_code == 400, r.text[:300]
        calm, attacked, flood = slowdown_beside(server.url, "/v1/chat/completions", encoded(attack), encoded(chat()), 8)
        assert attacked < max(FLOOR_S, 3 * calm), (list(attack), attacked, calm)
        assert set(flood.statuses) <= {200, 400, 429}, flood.statuses
    settle(llm)


def test_30_tools_and_tool_calls_carry_a_bounded_number_of_values_into_the_template(tenants):
    """The chat template's caller walks every value of the tools and the calls' arguments: past TEMPLATE_VALUES
    in all, a 400 naming the field; just under it, the chat runs."""
    from nano_infer.api_server.tools import TEMPLATE_VALUES

    llm, server = tenants
    wide = {"type": "function", "function": {"name": "f", "parameters": {"enum": list(range(TEMPLATE_VALUES))}}}
    r = as_attacker(server.url, "/v1/chat/completions", chat(tools=[wide]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text[:300]
    assert f"more than {TEMPLATE_VALUES:,} JSON values" in r.json()["error"]["message"], r.text[:300]

    def turn(arguments: list) -> list[dict]:
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": json.dumps(arguments)}}
        return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": "x"}]

    tool = {"type": "function", "function": {"name": "f"}}  # 5 values with the list: the tool, its type, function, name
    fits = as_attacker(server.url, "/v1/chat/completions", chat(tools=[tool], max_tokens=1,
                                                                 messages=turn([0] * (TEMPLATE_VALUES - 6))))
    over = as_attacker(server.url, "/v1/chat/completions", chat(tools=[tool], max_tokens=1,
                                                                 messages=turn([0] * (TEMPLATE_VALUES - 5))))
    assert fits.status_code in (200, 400) and "JSON values" not in fits.text, fits.text[:300]
    assert over.status_code == 400 and over.json()["error"]["param"] == "messages", over.text[:300]


def tools(count: int, words: int) -> list[dict]:
    params = {"type": "object", "properties": {f"p{j}": {"type": "string", "description": "word " * words}
                                               for j in range(8)}}
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": "word " * words, "parameters": params}}
            for i in range(count)]


def test_29_a_tools_template_flood_is_rendered_in_the_attackers_turn(tenants):
    """128 tools, each described at length, rendered into the chat template and tokenized per request (then
    refused: longer than the model): the attacker's work, paced, not every tenant's first token."""
    llm, server = tenants
    attack = chat(tools=tools(128, 40), max_tokens=1)
    r = as_attacker(server.url, "/v1/chat/completions", attack)
    assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"], r.text[:300]
    calm, attacked, flood = slowdown_beside(server.url, "/v1/chat/completions", encoded(attack),
                                            encoded(chat(max_tokens=1)), 8)
    assert attacked < max(FLOOR_S, 3 * calm), (attacked, calm)
    assert flood.statuses[400] > 0, flood.statuses
    settle(llm)


def test_31_a_prefill_flood_leaves_another_tenant_its_first_token(tenants):
    """Many long prompts at once from one tenant (16 loops of 4 prompts of 480 token ids, all answered): each
    step's token budget would go to its prefills first, and a victim's short prompt waits behind all of them.
    A tenant's prompts join the engine at most one step's budget of prefill at a time."""
    llm, server = tenants
    rng = __import__("random").Random(0)
    long = encoded({"prompt": [[rng.randrange(5, 440) for _ in range(480)] for _ in range(4)], "max_tokens": 1})
    short = encoded({"prompt": [[rng.randrange(5, 440) for _ in range(8)] for _ in range(4)], "max_tokens": 1})
    calm, attacked, flood = slowdown_beside(server.url, "/v1/completions", long, short, 16)
    assert attacked < max(FLOOR_S, 3 * calm), (attacked, calm)
    assert set(flood.statuses) == {200}, flood.statuses
    settle(llm)


@pytest.fixture(scope="module")
def wide_vocab_tenants(tokenizer, tmp_path_factory):
    """Two tenants on the test model with Qwen2.5's vocabulary size (152,064 rows; those past the tokenizer's
    zero, as a checkpoint's padding rows) and 2,048 positions: a scored prompt row costs a log_softmax over
    152,064 logits, as on the real model."""
    from tests.helpers.model_factory import make_padded_vocab_dir

    folder = make_padded_vocab_dir(tmp_path_factory.mktemp("round4_wide"), tokenizer, max_position_embeddings=2048)
    with two_tenants(folder) as both:
        yield both


def test_32_echoed_prompts_with_logprobs_are_charged_to_the_scorer(wide_vocab_tenants):
    """echo + logprobs 20 over 3 prompts of 1,020 random token ids, in 2 loops: 64,260 prompt logprobs a
    request, each a decoded token and its 20 alternatives. Scored a bounded slice per step, and turned into
    the reply in the attacker's worker turn, not on the engine thread every stream's step waits for. Among a
    row's top 20 are padding rows past the tokenizer: no text (they were a 500)."""
    llm, server = wide_vocab_tenants
    rng = __import__("random").Random(1)
    prompts = [[rng.randrange(5, 440) for _ in range(1020)] for _ in range(3)]
    scored = encoded({"prompt": prompts, "echo": True, "logprobs": 20, "max_tokens": 1})
    r = as_attacker(server.url, "/v1/completions", content=scored, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text[:300]
    rows = [row for choice in r.json()["choices"] for row in choice["logprobs"]["top_logprobs"][1:]]
    assert len(rows) == 3 * 1020 and "" in set().union(*rows), len(rows)  # a padding row ranked, as no text
    plain = encoded({"prompt": prompts, "max_tokens": 1})
    calm, attacked, flood = slowdown_beside(server.url, "/v1/completions", scored, plain, 2)
    assert attacked < max(FLOOR_S, 3 * calm), (attacked, calm)
    assert set(flood.statuses) == {200}, flood.statuses
    settle(llm)


def test_33_logprobs_a_tenant_leaves_unread_are_held_within_its_share(tenants):
    """24 streams of 4 samples x 600 tokens with 20 logprobs each (50,400 entries apiece), sent from sockets that
    read nothing: the engine holds every sampled token's logprobs until a request ends, so what one tenant's
    requests may hold is bounded (Admission's logprob share) and the rest wait holding nothing; the victim's first
    token is bounded against the same streams without logprobs."""
    import socket
    import threading

    from nano_infer.async_engine.admission import LOGPROB_SHARE, logprob_entries
    from nano_infer import SamplingParams

    llm, server = tenants
    one = logprob_entries(SamplingParams(n=4, max_tokens=600, logprobs=20), 8, 2048)

    def stalled_streams(logprobs: bool) -> tuple[float, int]:
        body = encoded({"prompt": "To be", "n": 4, "max_tokens": 600, "ignore_eos": True, "stream": True,
                        **({"logprobs": 20} if logprobs else {})})
        socks, held, stop = [], [0], threading.Event()

        def watch():
            while not stop.is_set():
                held[0] = max(held[0], llm._admission.logprobs.get("key 1", 0))
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for _ in range(24):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                         b"authorization: Bearer " + ATTACKER.encode() + b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            socks.append(sock)
        time.sleep(1.0)  # the streams run, their replies unread
        first_token = victim_first_tokens(server.url)
        stop.set()
        watcher.join()
        for sock in socks:
            sock.close()
        settle(llm)
        return first_token, held[0]

    calm, _ = stalled_streams(logprobs=False)
    attacked, held = stalled_streams(logprobs=True)
    print(f"\nvictim's first token {calm:.3f} s beside plain streams, {attacked:.3f} s beside logprob streams; "
          f"the attacker held at most {held:,} logprob entries (share {LOGPROB_SHARE:,})")
    assert one <= held <= LOGPROB_SHARE, (held, one)
    assert attacked < max(FLOOR_S, 3 * calm), (attacked, calm)
