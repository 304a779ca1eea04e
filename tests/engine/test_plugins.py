"""Plug-ins: their order is their phase, the step's block copies run once, and only claimers are asked to claim."""
import pytest

from nano_infer import LLM, BeamSearchParams, SamplingParams
from nano_infer.beam import BeamSearcher
from nano_infer.engine.cpu_threads import FreeCoreThreads
from nano_infer.engine.memory import StepRecorder
from nano_infer.core.plugin import Phase, StepContext
from nano_infer.core.batch import BlockSwap
from nano_infer.kv.offload import KVOffloader
from nano_infer.models.loader import TINY_MODEL_DIR
from nano_infer.spec import SpeculativeDecoder

DRAFT = {"method": "draft_model", "model": str(TINY_MODEL_DIR.parent / "tiny_draft"), "num_speculative_tokens": 2}


def test_plugins_run_in_phase_order_the_tier_before_the_draft_and_the_recorder_last():
    llm = LLM(str(TINY_MODEL_DIR), dtype="float32", block_size=4, num_kv_blocks=64, kv_offloading_size=0.01,
              speculative_config=DRAFT, record_steps=True)
    engine = llm.engine
    threads = [FreeCoreThreads] * (engine.plugin(FreeCoreThreads) is not None)  # on a CPU, with threads to share
    assert [type(p) for p in engine.plugins] == [KVOffloader, SpeculativeDecoder, BeamSearcher, StepRecorder, *threads]
    assert [p.phase for p in engine.plugins] == [Phase.MOVE_BLOCKS, Phase.PROPOSE] + [Phase.OBSERVE] * (2 + len(threads))
    assert engine.claimers == [engine.plugin(SpeculativeDecoder), engine.plugin(BeamSearcher)]
    out = llm.generate(["to be, or not to be, to be, or not to be"], SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8 and engine.history


def test_a_plain_engine_has_only_the_beam_searcher_which_keeps_only_live_beam_requests():
    """Features register themselves and the engine builds them from its config: beam search is always on and
    serves BeamSearchParams; the state it keeps per request goes when the request finishes or is aborted. (On a
    CPU with threads to share, the thread policy runs beside it: no feature, nothing it claims.)"""
    llm = LLM(str(TINY_MODEL_DIR), dtype="float32")
    engine = llm.engine
    searcher = engine.plugin(BeamSearcher)
    threads = [p for p in [engine.plugin(FreeCoreThreads)] if p is not None]
    assert engine.plugins == [searcher, *threads] and engine.claimers == [searcher]
    assert engine.plugin(SpeculativeDecoder) is None
    assert engine.serving == {BeamSearchParams: searcher}
    llm.generate(["Hello"], SamplingParams(max_tokens=2))
    assert searcher.searches == {}
    llm.beam_search([{"prompt": "Hello"}], BeamSearchParams(beam_width=2, max_tokens=2))
    assert searcher.searches == {} and engine.requests == {}
    engine.add_request("b", "Hello", BeamSearchParams(beam_width=2, max_tokens=4))
    engine.step()
    assert list(searcher.searches) == ["b"]
    engine.abort_request("b")
    assert searcher.searches == {} and engine.requests == {}


def test_params_no_feature_serves_are_refused():
    engine = LLM(str(TINY_MODEL_DIR), dtype="float32").engine
    with pytest.raises(ValueError, match="params must be SamplingParams or one of BeamSearchParams, got dict"):
        engine.add_request("r", "Hello", {"max_tokens": 2})
    assert engine.requests == {}


class Runner:
    def __init__(self):
        self.swaps = []

    def swap(self, moves):
        self.swaps.append((list(moves.out), list(moves.copies), list(moves.into)))


def test_the_steps_block_copies_run_once_in_order_and_copies_added_after_them_are_refused():
    runner = Runner()
    step = StepContext(batch=None, runner=runner, moves=BlockSwap([], [(1, 2)], []), start=0.0)
    step.move_blocks(out=[(3, 0)], into=[(0, 3)])
    step.move_blocks()  # a later plug-in that reads the blocks: they are in place already
    assert runner.swaps == [([(3, 0)], [(1, 2)], [(0, 3)])] and step.moves is None
    with pytest.raises(RuntimeError, match="Phase.MOVE_BLOCKS"):
        step.move_blocks(out=[(4, 1)])



@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
def test_what_features_keep_per_sequence_is_gone_once_the_requests_are(prefix_cache):
    """The prefix cache's handles and hash chains, and the beam searcher's searches, are keyed by sequence or
    request and dropped when it finishes: samples (n > 1), beams, preemption (a pool of 24 blocks) and an abort."""
    llm = LLM(str(TINY_MODEL_DIR), dtype="float32", block_size=4, num_kv_blocks=24, prefix_cache=prefix_cache)
    engine = llm.engine
    prompts = ["to be, or not to be, that is the question", "to be, or not to be, whether 'tis nobler"]
    llm.generate(prompts, SamplingParams(n=3, max_tokens=12, ignore_eos=True, temperature=1.0, seed=0))
    llm.beam_search([{"prompt": p} for p in prompts], BeamSearchParams(beam_width=3, max_tokens=6))
    engine.add_request("aborted", prompts[0], SamplingParams(max_tokens=8))
    engine.step()
    engine.abort_request("aborted")
    cache = engine.kv.prefix_cache
    assert cache.handles == {} and cache.hashes.chains == {} and engine.plugin(BeamSearcher).searches == {}
    assert cache.num_cached_blocks() > 0 and engine.requests == {}
