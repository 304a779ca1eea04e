"""Admission: requests held per tenant within a fair share of the batch, and let in as seats free up.

A flood from one tenant against another's first token, through the server, is attack 7 in
tests/api_server/test_attacks.py."""
import asyncio

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
