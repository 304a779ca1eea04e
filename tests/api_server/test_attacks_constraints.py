"""The compiled-constraint cache under two tenants: nothing revealed or evicted across them, memory returned,
and a schema that stands for a huge regex refused before it reaches a compile worker.

Each test asserts on the cache and the compile pool (what was compiled, for whom, what is kept), never on
wall-clock time; memory is the server process's RSS against a start measured in the same test.
"""
import asyncio
import gc
import json
import uuid

import psutil
import pytest

from nano_infer import SamplingParams
from nano_infer.api_server.protocol import JSON_OBJECT
from nano_infer.constrained import ConstraintLimits
from nano_infer.constrained.constraint import constraint_key
from nano_infer.constrained.index_cache import OWNER_SHARE, SHARED
from tests.helpers.attacks import VICTIM, as_attacker, chat, settle, two_tenants

pytestmark = pytest.mark.slow  # a live server, dozens of compiles in worker processes

CACHE_BYTES = 96 << 20  # room for a couple of the many-state indexes below per tenant, not for a dozen
VICTIM_TENANT, ATTACKER_TENANT = "key 0", "key 1"  # the server's names for VICTIM's and ATTACKER's keys


@pytest.fixture(scope="module")
def tenants(qwen2_dir):
    limits = ConstraintLimits(timeout=30, cache_bytes=CACHE_BYTES)
    with two_tenants(qwen2_dir, constraint_limits=limits, max_num_seqs=128) as (llm, server):
        asyncio.run(llm.precompile(SamplingParams(json_schema=JSON_OBJECT)))  # as `nano-infer serve` does at start
        yield llm, server


def schema_request(schema) -> dict:
    return chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})


def compiled(llm) -> dict:
    return dict(llm._compiler.pool.started)


def kept(llm, tenant) -> list:
    return llm.engine.vocabulary.index_cache.owned(tenant)


def test_a_schema_another_tenant_compiled_is_not_answered_from_their_entry(tenants):
    llm, server = tenants
    schema = {"type": "object", "properties": {f"v{uuid.uuid4().hex[:8]}": {"type": "integer"}}, "required": []}
    key = constraint_key(SamplingParams(json_schema=schema))
    assert as_attacker(server.url, "/v1/chat/completions", schema_request(schema), key=VICTIM).status_code == 200
    victims_entry = llm.engine.vocabulary.index_cache.get(VICTIM_TENANT, key)
    before = compiled(llm)

    guess = as_attacker(server.url, "/v1/chat/completions", schema_request(schema))  # the attacker's guess is right
    assert guess.status_code == 200, guess.text[:300]
    after = compiled(llm)
    assert after.get(ATTACKER_TENANT, 0) == before.get(ATTACKER_TENANT, 0) + 1  # compiled anew, for the attacker
    assert key in kept(llm, ATTACKER_TENANT) and llm.engine.vocabulary.index_cache.get(ATTACKER_TENANT, key) is not \
        victims_entry

    # the control: json_object, which the operator compiled at start, is one entry both tenants read
    for key_ in (VICTIM, None):
        r = as_attacker(server.url, "/v1/chat/completions", chat(response_format={"type": "json_object"}),
                        **({"key": key_} if key_ else {}))
        assert r.status_code == 200, r.text[:300]
    assert compiled(llm).get(SHARED) == 1 and compiled(llm).get(ATTACKER_TENANT) == after[ATTACKER_TENANT]
    settle(llm)


def test_40_regexes_from_one_tenant_do_not_evict_anothers_entry(tenants):
    llm, server = tenants
    run = uuid.uuid4().hex[:8]
    schema = {"type": "object", "properties": {f"w{run}": {"type": "boolean"}}, "required": [f"w{run}"]}
    key = constraint_key(SamplingParams(json_schema=schema))
    assert as_attacker(server.url, "/v1/chat/completions", schema_request(schema), key=VICTIM).status_code == 200
    victims = compiled(llm)[VICTIM_TENANT]

    for i in range(40):  # more than a tenant's 32 entries: the old shared cache of 32 lost the victim's
        r = as_attacker(server.url, "/v1/chat/completions", chat(guided_regex=f"(yes|no|{run}{i})", max_tokens=2))
        assert r.status_code == 200, r.text[:300]
    assert len(kept(llm, ATTACKER_TENANT)) <= llm.engine.vocabulary.index_cache.per_owner
    assert key in kept(llm, VICTIM_TENANT)

    again = as_attacker(server.url, "/v1/chat/completions", schema_request(schema), key=VICTIM)
    assert again.status_code == 200 and compiled(llm)[VICTIM_TENANT] == victims  # answered from its own entry
    settle(llm)


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_many_state_regexes_with_128_samples_give_their_memory_back(tenants):
    """Each regex has 4,096 DFA states and 128 samples walk them: before, each index kept a mask row for
    every state visited and a nested-list copy of its DFA, and the cache kept a dozen of them."""
    llm, server = tenants
    run = uuid.uuid4().hex[:6]
    body = lambda i: chat(guided_regex=f"{run}{i:02d}(a|b)*a(a|b){{11}}", n=128, max_tokens=32, temperature=1.0)
    assert as_attacker(server.url, "/v1/chat/completions", body(99), timeout=120).status_code == 200
    cache = llm.engine.vocabulary.index_cache
    size = max(e.nbytes for entries in cache._owners.values() for e in entries.values())
    settle(llm)
    start = rss()
    for i in range(12):
        r = as_attacker(server.url, "/v1/chat/completions", body(i), timeout=120)
        assert r.status_code == 200, r.text[:300]
    settle(llm)
    grown = rss() - start
    print(f"\nRSS {start / 2**20:.0f} MiB -> {(start + grown) / 2**20:.0f} MiB after 12 regexes; an index counts "
          f"{size / 2**20:.1f} MiB; the cache holds {cache.nbytes / 2**20:.1f} MiB")
    assert cache.nbytes <= CACHE_BYTES and len(kept(llm, ATTACKER_TENANT)) <= CACHE_BYTES // OWNER_SHARE // size
    assert grown < 8 * size, (grown, size)  # all twelve kept would be 12 * size, with nothing else left behind


def nested_arrays(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_schema_nested_24_deep_is_refused_before_a_worker_sees_it(tenants):
    """Under a kilobyte of JSON, a regex that doubles per level: refused by its computed length."""
    llm, server = tenants
    schema = {"type": "object", "properties": {f"x{uuid.uuid4().hex[:8]}": nested_arrays(24)}, "required": []}
    assert len(json.dumps(schema)) < 1000
    before = compiled(llm)
    r = as_attacker(server.url, "/v1/chat/completions", schema_request(schema))
    assert r.status_code == 400, r.text[:300]
    message = r.json()["error"]["message"]
    assert "ConstraintLimits.max_regex_chars" in message and "200,000" in message, message
    assert compiled(llm) == before  # no worker was asked to write it
    settle(llm)
