"""logit_bias and allowed_token_ids as large as a body may carry, two tenants (issue 53).

Each attack floods from the attacker's key while the victim's first tokens are timed; the bound is
relative to a control load (the same requests without the rule) measured in the same run. The model
has Qwen2.5's vocabulary size (152,064 rows, of which the tokenizer's are real and the rest zero, as a
checkpoint's padding rows), so a rule over the whole vocabulary is as large as on the real model.
"""
import re

import psutil
import pytest

from tests.helpers.attacks import (MAX_GAP, Flood, as_attacker, chat, encoded, settle, two_tenants,
                                   victim_first_tokens)

pytestmark = pytest.mark.slow  # live servers under load
VOCAB = 152_064
BIAS_IDS = 16_000  # as many logit_bias keys as a body may hold (ServerLimits.max_body_keys is 16,384)
RSS_SLACK = 200 * 1024**2


@pytest.fixture(scope="module")
def tenants(tmp_path_factory, tokenizer):
    """Two tenants on a model of VOCAB rows, up to 128 sequences a step (a request of n=128 runs whole)."""
    from tests.helpers.model_factory import make_padded_vocab_dir

    folder = make_padded_vocab_dir(tmp_path_factory.mktemp("token_rules_vocab"), tokenizer, VOCAB)
    with two_tenants(folder, max_num_seqs=128) as both:
        yield both


def greedy(n: int, max_tokens: int = 8, **rules) -> dict:
    return chat(n=n, temperature=0, max_tokens=max_tokens, ignore_eos=True, **rules)


def answered(url, body: dict) -> list[str]:
    r = as_attacker(url, "/v1/chat/completions", content=encoded(body), headers={"content-type": "application/json"},
                    timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["completion_tokens"] == body["n"] * body["max_tokens"]
    return [c["message"]["content"] for c in r.json()["choices"]]


def under_attack(tenants, attack: dict, control: dict, loops: int) -> None:
    """The victim's slowest first token under the attack within 3x its slowest under the control load (the
    same loops, before it, which also leaves the allocator warm); every attack answered; the engine idle after
    and the server's RSS within RSS_SLACK of where it was before the attack."""
    llm, server = tenants
    with Flood(server.url, "/v1/chat/completions", encoded(control), loops):
        calm = victim_first_tokens(server.url)
    settle(llm)
    before = psutil.Process().memory_info().rss
    with Flood(server.url, "/v1/chat/completions", encoded(attack), loops) as flood:
        attacked = victim_first_tokens(server.url)
    settle(llm)
    grown = psutil.Process().memory_info().rss - before
    print(f"\nvictim's first token {calm:.3f} s under the control load, {attacked:.3f} s under the attack "
          f"({sum(flood.statuses.values())} attacks); RSS {grown / 2**20:+.0f} MiB")
    assert attacked < max(MAX_GAP, 3 * calm), (attacked, calm)
    assert set(flood.statuses) == {200}, flood.statuses
    assert grown < RSS_SLACK, grown / 2**20


def test_1_a_logit_bias_of_every_id_a_body_holds_slows_only_its_sender(tenants, tokenizer):
    """16,000 biases on 16 samples: each step added 256,000 (row, id, bias) triples built in Python."""
    llm, server = tenants
    favoured = tokenizer.convert_tokens_to_ids("a")
    bias = {str(t): 100.0 if t == favoured else -100.0 for t in range(BIAS_IDS)}
    attack = greedy(16, logit_bias=bias)
    assert set(answered(server.url, attack)) == {"a" * 8}  # +100 on one token, -100 on the rest: it wins each step
    under_attack(tenants, attack, greedy(16), loops=4)


def test_2_allowed_token_ids_of_the_whole_vocabulary_slow_only_their_sender(tenants):
    """All 152,064 ids allowed on 16 samples: each step built 2.4 million ids in Python lists."""
    llm, server = tenants
    attack, control = greedy(16, allowed_token_ids=list(range(VOCAB))), greedy(16)
    assert answered(server.url, attack) == answered(server.url, control)  # every id allowed: nothing changes
    under_attack(tenants, attack, control, loops=4)


def test_3_n128_with_2_18_allowed_ids_is_one_mask_a_step_and_its_memory_goes(tenants, tokenizer):
    """n=128 and 2**18 allowed ids (two tokens, repeated): each step built 33 million ids in Python, steps took
    seconds each, and the server kept hundreds of MB after. The samples share one index tensor now."""
    llm, server = tenants
    two = [tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("b")]
    attack, control = greedy(128, max_tokens=4, allowed_token_ids=two * 2**17), greedy(128, max_tokens=4)
    texts = answered(server.url, attack)
    assert len(texts) == 128 and all(re.fullmatch("[ab]{4}", t) for t in texts), texts[:3]
    under_attack(tenants, attack, control, loops=1)
