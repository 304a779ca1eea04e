"""Plug-ins: their order is their phase, the step's block copies run once, and only claimers are asked to claim."""
import pytest

from nano_infer import LLM, BeamSearchParams, SamplingParams
from nano_infer.beam import BeamSearcher
from nano_infer.engine.memory import StepRecorder
from nano_infer.engine.plugin import Phase, StepContext
from nano_infer.kv.offload import BlockSwap, KVOffloader
from nano_infer.models.loader import TINY_MODEL_DIR
from nano_infer.spec import SpeculativeDecoder

DRAFT = {"method": "draft_model", "model": str(TINY_MODEL_DIR.parent / "tiny_draft"), "num_speculative_tokens": 2}


def test_plugins_run_in_phase_order_the_tier_before_the_draft_and_the_recorder_last():
    llm = LLM(str(TINY_MODEL_DIR), dtype="float32", block_size=4, num_kv_blocks=64, kv_offloading_size=0.01,
              speculative_config=DRAFT, record_steps=True)
    engine = llm.engine
    assert [type(p) for p in engine.plugins] == [KVOffloader, SpeculativeDecoder, StepRecorder]
    assert [p.phase for p in engine.plugins] == [Phase.MOVE_BLOCKS, Phase.PROPOSE, Phase.OBSERVE]
    assert engine.claimers == [engine.spec]
    out = llm.generate(["to be, or not to be, to be, or not to be"], SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 8 and engine.history


def test_a_plain_engine_asks_no_plugin_and_makes_the_beam_searcher_on_the_first_beam_request():
    llm = LLM(str(TINY_MODEL_DIR), dtype="float32")
    engine = llm.engine
    assert engine.plugins == [] and engine.claimers == [] and engine.beam_searcher is None
    llm.generate(["Hello"], SamplingParams(max_tokens=2))
    assert engine.beam_searcher is None
    llm.beam_search([{"prompt": "Hello"}], BeamSearchParams(beam_width=2, max_tokens=2))
    assert isinstance(engine.beam_searcher, BeamSearcher)
    assert engine.plugins == engine.claimers == [engine.beam_searcher]


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

