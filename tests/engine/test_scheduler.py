"""The scheduler with a real BlockManager (and prefix cache), driven by the engine loop without a model.

Each test runs LLMEngine.step's bookkeeping by hand: schedule, copy blocks, write K/V,
advance num_computed_tokens, append a token when a sequence reaches its end, finish it
at its length, offer the computed blocks to the prefix cache. K/V is modelled as in
helpers/block_machine: each slot holds the token prefix that produced it, so a sequence
that restarts from a wrong cache hit, or reads a block someone overwrote, is caught.
Output tokens are a fixed function of (request, position), as greedy decoding would be.
"""
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nano_infer.config import EngineConfig
from nano_infer.kv import BlockManager
from nano_infer.kv.manager import KVManager
from nano_infer.prefix import make_prefix_cache
from nano_infer.sampling_params import SamplingParams
from nano_infer.engine.scheduler import Scheduler
from nano_infer.core.sequence import Sequence, SequenceStatus
from tests.helpers.kv_model import apply_block_copies


@dataclass
class Workload:
    block_size: int
    num_blocks: int
    cache: str | None
    policy: str
    mode: str
    chunked_prefill: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    requests: list[tuple[int, list[int], int]]  # (arrival step, prompt, max_tokens)


def output_token(request: int, index: int) -> int:
    return (3 * request + index) % 4


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4]))
    cache = draw(st.sampled_from([None, "hash", "radix"]))
    bases = [[], [0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 3, 2]]  # shared "system prompts"
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        base = draw(st.sampled_from(bases))
        prompt = base[: draw(st.integers(0, len(base)))] + draw(st.lists(st.integers(0, 3), min_size=1, max_size=8))
        requests.append((draw(st.integers(0, 6)), prompt, draw(st.integers(1, 6))))
    # The engine rejects a request that could never fit the pool; small pools force preemption.
    need = max(-(-(len(p) + m) // block_size) for _, p, m in requests)
    return Workload(
        block_size=block_size,
        num_blocks=need + draw(st.integers(0, 4)),
        cache=cache,
        policy=draw(st.sampled_from(["fcfs", "lpm"])) if cache else "fcfs",
        mode=draw(st.sampled_from(["continuous", "static"])),
        chunked_prefill=draw(st.booleans()),
        max_num_seqs=draw(st.integers(1, 4)),
        max_num_batched_tokens=draw(st.integers(1, 16)),
        requests=requests,
    )


class EngineLoop:
    """LLMEngine.step's bookkeeping around a Scheduler, checking the step's promises as it goes."""

    def __init__(self, w: Workload):
        self.w = w
        self.bm = BlockManager(w.num_blocks, w.block_size)
        self.cache = make_prefix_cache(w.cache, w.block_size)
        self.kv = KVManager(self.bm, self.cache)
        self.scheduler = Scheduler(self.kv, max_num_seqs=w.max_num_seqs,
                                   max_num_batched_tokens=w.max_num_batched_tokens, policy=w.policy,
                                   mode=w.mode, chunked_prefill=w.chunked_prefill)
        self.pool: dict[int, tuple[int, ...]] = {}
        self.seqs: list[Sequence] = []
        self.request_of: dict[Sequence, int] = {}
        self.added: set[int] = set()
        self.num_preemptions = 0

    def add(self, r: int) -> None:
        _, prompt, max_tokens = self.w.requests[r]
        seq = Sequence(f"r{r}", list(prompt), SamplingParams(max_tokens=max_tokens))
        self.request_of[seq] = r
        self.added.add(r)
        self.seqs.append(seq)
        self.scheduler.add(seq)

    def step(self) -> None:
        sched, bs = self.scheduler, self.w.block_size
        running_before, waiting_before = list(sched.running), list(sched.waiting)
        out = sched.schedule()
        seqs = [e.seq for e in out.scheduled]
        work = [(e.seq, e.num_tokens) for e in out.scheduled]

        # budget and batch limits
        assert out.scheduled or out.preempted, "a step with work left scheduled nothing"
        assert len(set(seqs)) == len(seqs), "a sequence scheduled twice in one step"
        if self.w.chunked_prefill:
            assert out.num_batched_tokens <= self.w.max_num_batched_tokens
        else:  # a whole prompt larger than the budget may run, alone
            assert out.num_batched_tokens <= self.w.max_num_batched_tokens or len(seqs) == 1
        assert len(seqs) <= self.w.max_num_seqs and len(sched.running) <= self.w.max_num_seqs
        for seq, n in work:
            assert 1 <= n <= seq.num_uncomputed_tokens
            assert seq.status is SequenceStatus.RUNNING and seq in sched.running

        # running sequences first, in admission order, then newly admitted ones
        old = [s for s in seqs if s in running_before]
        new = [s for s in seqs if s not in running_before]
        assert seqs == old + new, "a newly admitted sequence is scheduled before a running one"
        assert old == running_before[: len(old)]
        assert all(s in waiting_before for s in new)
        assert sched.running[len(running_before) - len(out.preempted):] == new
        if self.w.mode == "static" and running_before:
            assert not new, "static batching admitted a request while the batch still runs"

        # preemption: the most recently admitted go first, back to the front of the queue
        k = len(out.preempted)
        assert out.preempted == running_before[::-1][:k]
        assert list(sched.waiting)[:k] == out.preempted[::-1]
        for seq in out.preempted:
            assert seq not in seqs and seq.status is SequenceStatus.WAITING
            assert seq.num_computed_tokens == 0 and seq.block_table == [] and seq.seq_id not in self.kv.prefix_cache.handles
        self.num_preemptions += k
        for seq in new:  # restarts from scratch, or from its cache hit
            if self.cache is None:
                assert seq.num_computed_tokens == 0
            else:
                assert seq.num_computed_tokens % bs == 0 or seq.num_computed_tokens == len(seq) - 1

        # the runner: block copies, then K/V writes
        apply_block_copies(self.pool, out.copies, bs)
        written = set()
        for seq, n in work:
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                slot = self.bm.slot(seq, pos)
                assert slot not in written
                written.add(slot)
                self.pool[slot] = tuple(seq.token_ids[: pos + 1])

        # LLMEngine.step: advance, sample at the end of the sequence, finish at max_tokens
        for seq, n in work:
            sample = seq.num_computed_tokens + n == len(seq)
            seq.num_computed_tokens += n
            if sample:
                seq.token_ids.append(output_token(self.request_of[seq], seq.num_output_tokens))
                if seq.num_output_tokens >= seq.params.max_tokens:
                    sched.finish(seq, "length")
        sched.update_from_output(out)
        self.check_blocks()

    def check_blocks(self) -> None:
        holders = Counter(b for seq in self.scheduler.running for b in seq.block_table)
        assert all(not seq.block_table for seq in self.scheduler.waiting)
        # block tables, and the prefix cache's own reference on each block it keeps
        assert all(self.bm.ref_count[b] == holders[b] + self.kv.holds(b) for b in range(self.bm.num_blocks))
        assert len(set(self.bm.pool.free_blocks)) == self.bm.num_free_blocks
        for seq in self.scheduler.running:
            for pos in range(seq.num_computed_tokens):
                assert self.pool.get(self.bm.slot(seq, pos)) == tuple(seq.token_ids[: pos + 1]), (
                    f"{seq.request_id} reads wrong K/V at position {pos}")

    def run(self) -> int:
        """Run to completion; returns the number of steps."""
        w = self.w
        arrivals = sorted((r for r in range(len(w.requests)) if r not in self.added), key=lambda r: w.requests[r][0])
        total_tokens = sum(len(p) + m for _, p, m in w.requests)
        max_steps = max(a for a, _, _ in w.requests) + 2 * total_tokens * len(w.requests) + 10
        step = 0
        while arrivals or self.scheduler.waiting or self.scheduler.running:
            while arrivals and w.requests[arrivals[0]][0] <= step:
                self.add(arrivals.pop(0))
            if self.scheduler.waiting or self.scheduler.running:
                self.step()
            step += 1
            assert step <= max_steps, f"no progress: {step} steps for {total_tokens} tokens (livelock)"
        return step

    def check_finished(self) -> None:
        for seq in self.seqs:
            r = self.request_of[seq]
            _, prompt, max_tokens = self.w.requests[r]
            assert seq.is_finished and seq.finish_reason == "length"
            assert seq.token_ids == prompt + [output_token(r, i) for i in range(max_tokens)]
        if self.cache is not None:
            assert self.cache.stats.num_queries == len(self.seqs)
            assert self.cache.stats.query_tokens == sum(len(p) for _, p, _ in self.w.requests)
            self.kv.clear()
            assert self.cache.num_cached_blocks() == 0
            if self.w.cache == "radix":
                assert all(node.lock_ref == 0 for node in self.cache.nodes())
        assert sorted(self.bm.pool.free_blocks) == list(range(self.bm.num_blocks))
        assert self.bm.ref_count == [0] * self.bm.num_blocks


@settings(max_examples=250, deadline=None)
@given(workloads())
def test_every_request_finishes_and_every_step_keeps_the_scheduler_promises(w):
    loop = EngineLoop(w)
    loop.run()
    loop.check_finished()


# -- unit tests ------------------------------------------------------------------------------------
def make_loop(**kw) -> EngineLoop:
    base = dict(block_size=2, num_blocks=8, cache=None, policy="fcfs", mode="continuous", chunked_prefill=True,
                max_num_seqs=4, max_num_batched_tokens=8, requests=[])
    return EngineLoop(Workload(**{**base, **kw}))


def test_chunked_prefill_shares_a_step_with_decodes():
    loop = make_loop(max_num_batched_tokens=4, requests=[(0, [1, 2], 4), (1, [3] * 9, 1)])
    loop.add(0)
    loop.step()  # prefill of r0
    loop.add(1)
    out = loop.scheduler.schedule()
    assert [(e.seq.request_id, e.num_tokens) for e in out.scheduled] == [("r0", 1), ("r1", 3)]


def test_a_full_pool_preempts_the_most_recent_request_and_it_recomputes_from_zero():
    # 3 blocks of 2: r0 and r1 fill them with their prompts; r0's first decode needs a fourth.
    loop = make_loop(num_blocks=3, requests=[(0, [1, 2, 3, 4], 2), (0, [5, 6], 2)])
    loop.add(0)
    loop.add(1)
    loop.step()
    r0, r1 = loop.scheduler.running
    loop.step()  # r0 decodes into a new block: r1 is preempted
    assert loop.num_preemptions == 1 and r1.num_preemptions == 1
    assert list(loop.scheduler.waiting) == [r1] and r1.num_computed_tokens == 0
    assert loop.run() > 0
    loop.check_finished()


def test_static_batching_waits_for_the_whole_batch():
    loop = make_loop(mode="static", requests=[(0, [1], 1), (0, [2], 3), (0, [3], 1)], max_num_seqs=2)
    for r in range(3):
        loop.add(r)
    loop.step()  # r0 and r1 admitted; r0 finishes at once
    for _ in range(2):  # r1 decodes its other two tokens; r2 waits although a seat is free
        assert [s.request_id for s in loop.scheduler.running] == ["r1"]
        assert [s.request_id for s in loop.scheduler.waiting] == ["r2"]
        loop.step()
    assert not loop.scheduler.running
    loop.step()
    assert not loop.scheduler.waiting and not loop.scheduler.running
    loop.check_finished()


@pytest.mark.parametrize("max_queue,admitted", [(128, "r2"), (1, "r1")])
def test_lpm_admits_the_longest_cached_prefix_first(monkeypatch, max_queue, admitted):
    """...while the queue is at most LPM_MAX_QUEUE long; past that, first come first served."""
    monkeypatch.setattr("nano_infer.engine.scheduler.LPM_MAX_QUEUE", max_queue)
    loop = make_loop(cache="radix", policy="lpm", max_num_seqs=1,
                     requests=[(0, [1, 2, 3, 4, 5], 1), (0, [9, 9, 9], 1), (0, [1, 2, 3, 4, 7], 1)])
    loop.add(0)
    loop.run()
    loop.add(1)
    loop.add(2)
    out = loop.scheduler.schedule()
    assert [e.seq.request_id for e in out.scheduled] == [admitted]
    if admitted == "r2":
        assert out.scheduled[0].seq.num_computed_tokens == 4


@pytest.mark.parametrize("kwargs", [dict(scheduler_policy="lpm", prefix_cache=None), dict(scheduler_policy="bad"),
                                    dict(scheduler="bad")])
def test_bad_options_are_rejected(kwargs):
    """...by EngineConfig, before any weights load."""
    with pytest.raises(ValueError):
        EngineConfig(**kwargs)


def test_a_waiting_prompt_shares_the_step_with_a_long_running_one():
    """A 200-token prompt being computed in chunks of a 64-token budget, and a 4-token prompt arriving: with
    prompt_share 0.5 the newcomer is computed in the next step beside a 32-token chunk; with the whole budget to
    running chunks (prompt_share 1) it waits for the long prompt's last chunk. Alone, a prompt gets all 64."""
    def steps_until_short_runs(share: float) -> tuple[list[int], int]:
        sched = Scheduler(KVManager(BlockManager(256, 16)), max_num_seqs=4, max_num_batched_tokens=64,
                          prompt_share=share)
        sched.add(Sequence("long", [1] * 200, SamplingParams()))
        first = sched.schedule().scheduled
        first[0].seq.num_computed_tokens += first[0].num_tokens
        sched.add(Sequence("short", [2] * 4, SamplingParams()))
        for step in range(1, 10):
            out = sched.schedule().scheduled
            for s in out:
                s.seq.num_computed_tokens += s.num_tokens
            if any(s.seq.request_id == "short" for s in out):
                return [s.num_tokens for s in first], step
        raise AssertionError("the short prompt never ran")

    assert steps_until_short_runs(0.5) == ([64], 1)
    assert steps_until_short_runs(1.0) == ([64], 3)  # after the long prompt's chunks of 64, 64 and 8 (+ 4)
