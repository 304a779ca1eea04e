"""Beam search's bookkeeping without a model: hand-built offers, expectations worked out by hand, and a
state machine over a real engine whose every block must be accounted for after every step."""
import math
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nano_infer import LLMEngine, SamplingParams
from nano_infer.beam import BeamSearchParams, BeamState, num_candidates
from nano_infer.beam.search import Beam


@dataclass(eq=False)
class Toy:
    """What BeamState tracks a beam by: anything with its output tokens (the engine: a Sequence)."""

    output_token_ids: list[int] = field(default_factory=list)


def beam(tokens=()):
    return Toy(list(tokens))


def offer(state, seq, table: dict[int, float]):
    """A beam's offer: {token: probability}, best first, as the plug-in would give it."""
    ranked = sorted(table.items(), key=lambda kv: -kv[1])
    state.offer(seq, torch.tensor([p for _, p in ranked]).log(), torch.tensor([t for t, _ in ranked]))


def test_candidates_reach_past_every_eos():
    """Four EOS ids: (1 + 4) x 2 = 10 candidates are kept, so two beams go on although the four best end."""
    assert num_candidates(2, 4) == 10 and num_candidates(3, 0) == 6 and num_candidates(1, 1) == 2
    root = beam()
    state = BeamState.start(BeamSearchParams(2, 8), root, {1, 2, 3, 4}, 8)
    offer(state, root, {1: 0.3, 2: 0.2, 3: 0.15, 4: 0.1, 5: 0.08, 6: 0.07, 7: 0.05, 8: 0.03, 9: 0.01, 10: 0.01})
    kept = state.select()
    assert [c.token for c in kept] == [5, 6]  # with 2 x 2 = 4 candidates, all four EOS, none would go on
    # only the EOS candidates ranked in the top k (= 2) become hypotheses, best score first
    assert [h.output_token_ids for h in state.finished] == [[1], [2]]
    assert [h.finish_reason for h in state.finished] == ["stop", "stop"]
    # two hypotheses, and the best running beam (log .08) cannot beat the worse of them (log .2): done
    assert state.done


def test_length_penalty_scores_and_early_stop():
    a, b = beam([5]), beam([6])
    state = BeamState.start(BeamSearchParams(2, 8, length_penalty=2.0), a, {1}, 8)
    state.beams = [state.beams[0], Beam(b, math.log(0.5))]
    state.beams[0].cum_logprob = math.log(0.4)
    state.num_generated = 1
    offer(state, a, {1: 0.5, 7: 0.3, 8: 0.2})
    offer(state, b, {1: 0.6, 9: 0.25, 10: 0.15})
    kept = state.select()
    # totals: b+1 = .30, a+1 = .20, b+9 = .125, a+7 = .12 ... the top 2 are both EOS: two hypotheses of 2 tokens
    assert [h.output_token_ids for h in state.finished] == [[6, 1], [5, 1]]
    assert [h.score for h in state.finished] == pytest.approx([math.log(0.30) / 4, math.log(0.20) / 4])
    assert [(c.parent.seq, c.token) for c in kept] == [(b, 9), (a, 7)]
    # the best running beam, log(.125) / 2 ** 2 = -0.52, cannot beat the worst hypothesis, -0.40: the search stops
    assert state.done


def test_width_one_stops_at_its_first_hypothesis():
    root = beam()
    state = BeamState.start(BeamSearchParams(1, 8, length_penalty=2.0, early_stopping="never"), root, {1}, 8)
    offer(state, root, {1: 0.6, 2: 0.4})
    state.select()
    assert state.done and state.finished[0].output_token_ids == [1]


# -- every block accounted for, whatever happens to the beams ----------------------------------------------------------
@pytest.fixture(scope="module", params=[None, "radix"])
def engine(request, qwen2_dir):
    # a pool of 24 blocks of 2 tokens and 5 tokens a step: beams are preempted and split across steps
    return LLMEngine(str(qwen2_dir), dtype="float32", block_size=2, num_kv_blocks=24, prefix_cache=request.param,
                     max_num_batched_tokens=5, max_num_seqs=8)


class BeamMachine(RuleBasedStateMachine):
    """Beam requests, ordinary requests, steps and aborts on a small pool (forks, frees, preemption)."""

    engine = None

    def __init__(self):
        super().__init__()
        self.ids = 0
        self.widths = {}

    @rule(prompt=st.lists(st.integers(3, 440), min_size=1, max_size=9), width=st.integers(1, 4),
          max_tokens=st.integers(1, 12), ignore_eos=st.booleans())
    def add_beam_request(self, prompt, width, max_tokens, ignore_eos):
        self.ids += 1
        try:
            self.engine.add_request(f"b{self.ids}", prompt_token_ids=prompt,
                                    params=BeamSearchParams(width, max_tokens, ignore_eos=ignore_eos))
        except ValueError as e:  # more beams than the pool could ever hold: refused, nothing queued
            assert "KV blocks but the pool has" in str(e) and f"b{self.ids}" not in self.engine.requests
        else:
            self.widths[f"b{self.ids}"] = width

    @rule(prompt=st.lists(st.integers(3, 440), min_size=1, max_size=9), n=st.integers(1, 2))
    def add_sampled_request(self, prompt, n):
        self.ids += 1
        self.engine.add_request(f"s{self.ids}", prompt_token_ids=prompt,
                                params=SamplingParams(n=n, temperature=0.8, seed=self.ids, max_tokens=6))

    @precondition(lambda self: self.engine.has_unfinished_requests())
    @rule(times=st.integers(1, 4))
    def step(self, times):
        for _ in range(times):
            for out in self.engine.step():
                assert out.error is None
                if out.finished and out.request_id in self.widths:
                    assert len(out.outputs) == self.widths[out.request_id]

    @precondition(lambda self: self.engine.has_unfinished_requests())
    @rule(data=st.data())
    def abort(self, data):
        rid = data.draw(st.sampled_from(sorted(self.engine.requests)))
        assert self.engine.abort_request(rid).finished

    @invariant()
    def every_block_is_accounted_for(self):
        kv, sched = self.engine.kv, self.engine.scheduler
        holders = [0] * kv.num_blocks
        for seq in list(sched.running) + list(sched.waiting):
            assert not seq.is_finished
            for block in seq.block_table:
                holders[block] += 1
        for block in range(kv.num_blocks):
            assert kv.ref_count[block] == holders[block] + kv.holds(block), block
        free = set(kv.blocks.pool.free_blocks)
        assert len(free) == kv.num_free_blocks and free == {b for b in range(kv.num_blocks) if kv.ref_count[b] == 0}
        live = {s.seq_id for r in self.engine.requests.values() for s in r.seqs if not s.is_finished}
        assert live == {s.seq_id for s in list(sched.running) + list(sched.waiting)}

    def teardown(self):
        for _ in range(3000):  # every request ends: a deadlock (beams waiting on each other) fails here
            if not self.engine.has_unfinished_requests():
                break
            self.engine.step()
        stuck = sorted(self.engine.requests)
        for rid in stuck:  # leave the shared engine clean for the next example, then fail
            self.engine.abort_request(rid)
        assert not stuck, f"requests {stuck} never finish"
        self.engine.kv.clear()
        assert self.engine.kv.num_free_blocks == self.engine.kv.num_blocks
        assert all(r == 0 for r in self.engine.kv.ref_count)


def test_beam_state_machine(engine):
    BeamMachine.engine = engine
    BeamMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
    BeamMachine.TestCase().runTest()
