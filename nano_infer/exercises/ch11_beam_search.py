"""Chapter 11 exercises: choose the next beams, score a hypothesis, fork and free after a round."""
from __future__ import annotations

import copy
import math

import torch
from hypothesis import strategies as st

from ..beam import BeamSearchParams, BeamState
from ..beam.search import Beam, length_penalised, num_candidates
from ..kv import BlockManager
from ..sampling_params import SamplingParams
from ..core.sequence import Sequence
from .core import call, exercise, expect, forall

VOCAB = 12  # candidates per beam: at most 3 x 4


class _Seq:
    """What BeamState tracks a beam by: only its output tokens are read."""

    def __init__(self, tokens):
        self.output_token_ids = tokens


@st.composite
def _rounds(draw):
    """A round of beam search: k live beams with cumulative log-probs, each offering its best tokens."""
    k = draw(st.integers(1, 4))
    eos = set(draw(st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True)))
    n = num_candidates(k, len(eos))
    width = 1 if draw(st.booleans()) and k > 1 else k  # the first round: one beam
    cums = sorted((-draw(st.integers(0, 40)) / 4 for _ in range(width)), reverse=True)
    offers = []
    for _ in range(width):
        tokens = draw(st.permutations(range(VOCAB)))[:n]
        logprobs = sorted((-draw(st.integers(0, 30)) / 8 for _ in range(n)), reverse=True)
        offers.append((tokens, logprobs))
    return k, eos, cums, offers


def _state(k, eos, cums, offers) -> BeamState:
    state = BeamState(BeamSearchParams(k, 100), frozenset(eos), 100, num_generated=3)
    state.beams = [Beam(_Seq([7] * 3 + [i]), float(torch.tensor(c, dtype=torch.float32))) for i, c in enumerate(cums)]
    for beam, (tokens, logprobs) in zip(state.beams, offers):
        state.offer(beam.seq, torch.tensor(logprobs, dtype=torch.float32), torch.tensor(tokens))
    return state


@exercise
def next_beams(candidate):
    """Your round keeps the k best candidates that do not end as beams, and finishes the EOS ones among the top k."""

    def prop(case):
        k, eos, cums, offers = case
        state = _state(k, eos, cums, offers)
        index = {id(b): i for i, b in enumerate(state.beams)}
        ranked = [(index[id(c.parent)], c.token, c.cum_logprob) for c in state.candidates()]
        kept = state.select()
        want_beams = [(index[id(c.parent)], c.token, c.cum_logprob) for c in kept]
        want_finished = [(h.output_token_ids[-2], h.output_token_ids[-1], h.cum_logprob) for h in state.finished]
        desc = f"k={k}, eos_ids={sorted(eos)}, candidates={ranked}"
        got = call(candidate, list(ranked), k, set(eos), case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, "(next_beams, finished)", got,
               why="return a pair: the next beams, then the newly finished hypotheses")
        beams, finished = [tuple(c) for c in got[0]], [tuple(c) for c in got[1]]
        expect(beams == want_beams, desc, want_beams, beams, why="the next beams (best first):")
        expect(finished == want_finished, desc, want_finished, finished, why="the newly finished hypotheses (best first):")

    # EOS ranks 2nd of 3 candidates with k=2: finished; an EOS ranked below the top k is only dropped
    forall(_rounds(), prop, examples=[(2, {0}, [-1.0, -2.0], [([5, 0, 3, 4], [-0.5, -0.75, -3.0, -4.0]),
                                                             ([0, 6, 7, 8], [-2.0, -2.5, -3.0, -3.5])])])


@exercise
def hypothesis_score(candidate):
    """Your score is transformers': the cumulative log-prob over the generated length to the power length_penalty."""

    def prop(case):
        cum, num_prompt, num_output, lp = case
        want = length_penalised([cum], num_output, lp)[0]
        desc = f"cum_logprob={cum}, num_prompt_tokens={num_prompt}, num_output_tokens={num_output}, length_penalty={lp}"
        got = call(candidate, cum, num_prompt, num_output, lp, case=desc)
        expect(math.isclose(float(got), want, rel_tol=1e-5, abs_tol=1e-6), desc, want, got, why="score:")

    cums = st.integers(-400, -1).map(lambda x: x / 8)
    penalties = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, -1.0])
    forall(st.tuples(cums, st.integers(1, 40), st.integers(1, 40), penalties), prop,
           examples=[(-6.0, 20, 6, 1.0), (-6.0, 20, 6, 2.0), (-6.0, 20, 6, 0.0)])


@st.composite
def _beam_tables(draw):
    """Live beams' block tables after a few rounds of a real BlockManager, and the next round's choice."""
    bs, k = draw(st.integers(1, 4)), draw(st.integers(2, 4))
    manager = BlockManager(64, bs)
    params = SamplingParams(max_tokens=100)
    root = Sequence("r", list(range(draw(st.integers(1, 9)))), params)
    manager.allocate(root, len(root))
    root.num_computed_tokens = len(root)
    beams = [root]
    for _ in range(draw(st.integers(0, 5))):  # earlier rounds: fork, free, append as the engine does
        extends = [beams[draw(st.integers(0, len(beams) - 1))] for _ in range(k)]
        beams = _apply(manager, beams, extends)
        for s in beams:
            s.token_ids.append(1)
            manager.allocate(s, 1)
            s.num_computed_tokens += 1
    extends = [draw(st.integers(0, len(beams) - 1)) for _ in range(k)]
    return manager, beams, extends


def _apply(manager, beams, extends):
    """One round on the block manager: the first beam to extend a parent keeps its sequence, the others
    fork it, a parent nobody extends is freed (BeamSearcher.advance)."""
    taken, new = set(), []
    for parent in extends:
        if id(parent) in taken:
            child = Sequence("r", parent.prompt_token_ids, parent.params, token_ids=list(parent.token_ids))
            child.num_computed_tokens = parent.num_computed_tokens
            manager.fork(parent, child)
            new.append(child)
        else:
            taken.add(id(parent))
            new.append(parent)
    for parent in beams:
        if id(parent) not in taken:
            manager.free(parent)
    return new


@exercise
def fork_and_free(candidate):
    """Your round forks a parent once per extra beam extending it, prunes the others, and frees only unshared blocks."""

    def prop(case):
        manager, beams, extends = case
        tables = {s.seq_id: list(s.block_table) for s in beams}
        chosen = [beams[i].seq_id for i in extends]
        after = copy.deepcopy((manager, beams))
        m, bs = after
        free_before = set(m.pool.free_blocks)
        _apply(m, bs, [bs[i] for i in extends])
        seen, forks = set(), []
        for sid in chosen:
            if sid in seen:
                forks.append(sid)
            seen.add(sid)
        want = (forks, sorted(set(tables) - seen), sorted(set(m.pool.free_blocks) - free_before))
        desc = f"block_tables={tables}, extends={chosen}"
        got = call(candidate, {s: list(t) for s, t in tables.items()}, list(chosen), case=desc)
        expect(isinstance(got, tuple) and len(got) == 3, desc, "(forks, pruned, freed_blocks)", got,
               why="return three lists: parents to fork, beams to prune, blocks that go back to the free list")
        got = (list(got[0]), sorted(got[1]), sorted(got[2]))
        expect(got[0] == want[0], desc, want[0], got[0], why="the parent of each fork, in the next beams' order:")
        expect(got[1] == want[1], desc, want[1], got[1], why="the beams nobody extends (pruned):")
        expect(got[2] == want[2], desc, want[2], got[2], why="the blocks that go back to the free list:")

    forall(_beam_tables(), prop, max_examples=60)
