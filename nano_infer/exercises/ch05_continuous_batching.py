"""Chapter 05 exercises: one continuous-batching step under a token budget, and longest-prefix-match order."""
from __future__ import annotations

from hypothesis import strategies as st

from ..kv.block_manager import BlockManager
from ..kv.manager import KVManager
from ..sampling_params import SamplingParams
from ..engine.scheduler import Scheduler
from ..core.sequence import Sequence, SequenceStatus
from .core import call, exercise, expect, forall


def _engine_step(running, waiting, token_budget, max_num_seqs):
    """What nano_infer's Scheduler schedules, with KV room to spare (no preemption)."""
    kv = KVManager(BlockManager(4096, 16))
    sched = Scheduler(kv, max_num_seqs=max_num_seqs, max_num_batched_tokens=token_budget)
    for rid, left in running:
        seq = Sequence(rid, [0] * (left + 3), SamplingParams())
        seq.num_computed_tokens = 3  # part of it already computed
        kv.allocate(seq, 0)
        seq.status = SequenceStatus.RUNNING
        sched.running.append(seq)
    for rid, left in waiting:
        sched.add(Sequence(rid, [0] * left, SamplingParams()))
    return [(e.seq.request_id, e.num_tokens) for e in sched.schedule().scheduled]


@st.composite
def _step_cases(draw):
    lefts = st.one_of(st.just(1), st.integers(1, 40))  # decodes need 1 token, prefills many
    n_run = draw(st.integers(0, 5))
    running = [(f"r{i}", draw(lefts)) for i in range(n_run)]
    waiting = [(f"w{i}", draw(st.integers(1, 40))) for i in range(draw(st.integers(0, 5)))]
    return running, waiting, draw(st.integers(1, 64)), draw(st.integers(max(n_run, 1), 8))


@exercise
def schedule_step(candidate):
    """Your step schedules what nano_infer's Scheduler does: running first, chunked prefill, budget and seat limits."""

    def prop(case):
        running, waiting, budget, max_seqs = case
        want = _engine_step(running, waiting, budget, max_seqs)
        desc = f"running={running}, waiting={waiting}, token_budget={budget}, max_num_seqs={max_seqs}"
        got = call(candidate, list(running), list(waiting), budget, max_seqs, case=desc)
        got = [tuple(x) for x in got]
        expect(got == want, desc, want, got, why="(request id, tokens this step):")

    forall(_step_cases(), prop, max_examples=50, examples=[
        ([("r0", 1), ("r1", 1)], [("w0", 30), ("w1", 5)], 16, 8),
        ([("r0", 1)], [("w0", 2), ("w1", 2), ("w2", 2)], 64, 2)])


def _lpm_reference(prompts, cached, block_size):
    def match(p):
        best = 0
        for c in cached:
            n = 0
            while n < min(len(p), len(c)) and p[n] == c[n]:
                n += 1
            best = max(best, n)
        return best // block_size * block_size
    return sorted(range(len(prompts)), key=lambda i: -match(prompts[i]))


_prompt = st.lists(st.integers(0, 2), max_size=8)


@exercise
def lpm_order(candidate):
    """Your order puts the longest cached prefix (whole blocks) first and keeps arrival order among ties."""

    def prop(case):
        prompts, cached, block_size = case
        want = _lpm_reference(prompts, cached, block_size)
        desc = f"prompts={prompts}, cached={cached}, block_size={block_size}"
        got = call(candidate, [list(p) for p in prompts], [list(c) for c in cached], block_size, case=desc)
        expect(list(got) == want, desc, want, got, why="indices of the prompts, in the order they are admitted:")

    forall(st.tuples(st.lists(_prompt, max_size=5), st.lists(_prompt, max_size=3), st.integers(1, 3)), prop,
           max_examples=50, examples=[([[1, 2, 3], [0, 0], [1, 2, 0], [1, 0]], [[1, 2, 3, 4]], 2)])
