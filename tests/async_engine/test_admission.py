"""Admission: requests held per tenant within a fair share of the batch, and let in as seats free up.

A flood from one tenant against another's first token, through the server, is attack 7 in
tests/api_server/test_attacks.py."""
import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from nano_infer import SamplingParams
from nano_infer.async_engine.async_llm import AsyncLLM
from tests.helpers.engine_checks import assert_idle_and_blocks_free


def test_requests_held_by_the_share_run_when_the_engine_empties(qwen2_dir):
    """One tenant, share max_num_seqs // 2 = 2: the other requests wait for admission. When the admitted
    ones finish in the same step the engine is empty, and the waiting ones must still be let in (and
    beam requests, which take n seats each, too)."""
    from nano_infer import BeamSearchParams

    llm = AsyncLLM(str(qwen2_dir), dtype="float32", block_size=4, max_num_seqs=4)

    async def one(params):
        return [out async for out in llm.generate([5, 6, 7], params, stream=False, tenant="t")][-1]

    async def all_of_them():
        greedy = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        return await asyncio.wait_for(asyncio.gather(*[one(greedy) for _ in range(6)],
                                                     *[one(BeamSearchParams(2, 3)) for _ in range(3)]), 60)

    try:
        outs = asyncio.run(all_of_them())
        assert all(o.finished for o in outs) and [len(o.outputs) for o in outs] == [1] * 6 + [2] * 3
        assert_idle_and_blocks_free(llm.engine)
    finally:
        llm.shutdown()


def _engine_requests(admitted, computed):
    """What Admission reads of the engine's requests: each admitted request's one sequence and its progress."""
    from types import SimpleNamespace

    return {item.request_id: SimpleNamespace(seqs=[SimpleNamespace(num_prompt_tokens=item.prompt_tokens,
                                                                  num_computed_tokens=computed[item.request_id])])
            for item in admitted if computed[item.request_id] is not None}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 700)), min_size=1, max_size=30),
       st.integers(1, 512))
def test_a_tenants_admitted_prompts_stay_within_one_steps_budget(requests, step_budget):
    """Whatever arrives, after each take() a tenant's admitted prompt tokens not yet computed are at most
    `prefill_share`, or are one request's alone; and every request is admitted in the end, as prefills finish
    (each step computes up to the budget of each admitted prompt, as chunked prefill does) and requests end."""
    from nano_infer.async_engine.admission import Admission

    share = 512
    admission = Admission(max_num_seqs=64, prefill_share=share)
    for i, (tenant, tokens) in enumerate(requests):
        admission.put(tenant, 0, 1, None, f"r{i}", tokens)
    admitted, computed = [], {}  # computed: None once the request has left the engine
    for _ in range(sum(tokens for _, tokens in requests) + 2 * len(requests) + 2):  # one token a step at worst
        for item in admission.take(_engine_requests(admitted, computed)):
            admitted.append(item)
            computed[item.request_id] = 0
        for tenant in "abc":
            mine = [i for i in admitted if i.tenant == tenant and computed[i.request_id] is not None
                    and computed[i.request_id] < i.prompt_tokens]
            left = sum(i.prompt_tokens - computed[i.request_id] for i in mine)
            assert left <= share or len(mine) == 1, (tenant, left, len(mine))
        for item in admitted:  # a step: prefills advance, finished prompts' requests end
            if computed[item.request_id] is None:
                continue
            if computed[item.request_id] >= item.prompt_tokens:
                computed[item.request_id] = None
                admission.done(item)
            else:
                computed[item.request_id] = min(item.prompt_tokens, computed[item.request_id] + step_budget)
    assert len(admitted) == len(requests) and not admission.queues and not admission.prefilling


def test_a_long_prompt_waits_for_its_tenants_prefill_not_for_anothers():
    """Tenant a's second prompt waits while its first is being computed; tenant b's joins at once."""
    from types import SimpleNamespace

    from nano_infer.async_engine.admission import Admission

    admission = Admission(max_num_seqs=64, prefill_share=512)
    first = admission.put("a", 0, 1, None, "a1", 480)
    admission.put("a", 0, 1, None, "a2", 480)
    assert admission.take() == [first]
    other = admission.put("b", 0, 1, None, "b1", 480)
    running = {"a1": SimpleNamespace(seqs=[SimpleNamespace(num_prompt_tokens=480, num_computed_tokens=256)])}
    assert admission.take(running) == [other]
    running["a1"].seqs[0].num_computed_tokens = 480
    assert [item.request_id for item in admission.take(running)] == ["a2"]


def test_a_tenants_logprobs_wait_past_its_share_and_plain_requests_do_not():
    """Requests that may hold more logprob entries than the tenant's share wait for the ones admitted to end;
    one always runs, another tenant's are let in, and a request without logprobs counts nothing."""
    from nano_infer.async_engine.admission import Admission, logprob_entries

    heavy = SamplingParams(n=4, max_tokens=1500, logprobs=20)
    assert logprob_entries(heavy, 10, 2048) == 4 * 1500 * 21
    assert logprob_entries(SamplingParams(max_tokens=None, logprobs=0, prompt_logprobs=2), 48, 2048) == 2000 + 48 * 3
    assert logprob_entries(SamplingParams(max_tokens=1500), 10, 2048) == 0
    admission = Admission(max_num_seqs=64, logprob_share=300_000)
    a = [admission.put("a", 0, 4, None, f"a{i}", 10, logprob_entries(heavy, 10, 2048)) for i in range(3)]
    plain = admission.put("a", 0, 1, None, "plain", 10, 0)
    b = admission.put("b", 0, 4, None, "b0", 10, logprob_entries(heavy, 10, 2048))
    taken = admission.take()
    assert a[0] in taken and b in taken and a[1] in taken and a[2] not in taken  # 3 x 126,000 > 300,000
    assert plain not in taken  # behind a[2] in its tenant's queue
    admission.done(a[0])
    assert admission.take() == [a[2], plain] and admission.logprobs == {"a": 252_000, "b": 126_000}
