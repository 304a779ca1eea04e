"""One request failing inside a step fails alone: the step's other requests get every token, no block leaks."""
import pytest

from nano_infer import LLM, LLMEngine, SamplingParams
from tests.helpers.engine_checks import assert_idle_and_blocks_free


@pytest.fixture(scope="module")
def engine(qwen2_dir):
    return LLMEngine(str(qwen2_dir), dtype="float32", block_size=4)


class Exploding:
    """Stands in for a part of one sequence that raises when the engine touches it."""

    def __init__(self, after: int = 0):
        self.calls, self.after = 0, after

    def __call__(self, *args):
        self.calls += 1
        if self.calls > self.after:
            raise OverflowError("boom")


def run_all(engine):
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


def greedy(n=8, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def alone(engine, prompt, params):
    engine.add_request("alone", prompt, params)
    return run_all(engine)["alone"].outputs[0].token_ids


@pytest.mark.parametrize("where", ["sample", "append"])
def test_a_failing_request_fails_alone(engine, where):
    want = alone(engine, "To be, or not", greedy())
    engine.add_request("victim", "To be, or not", greedy())
    engine.add_request("bad", "Hello there", SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, n=2, seed=1))
    engine.add_request("other", "Friends, Romans", SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True, seed=3))
    bad = engine.requests["bad"].seqs[0]
    if where == "sample":  # the batched draw raises on this row (as a 2**70 top_k once did)
        bad.sampling.generator = "not a generator"
    else:  # taking its token raises (as a constraint refusing the token once did)
        bad.sampling.detokenizer = type("D", (), {"add": Exploding(after=2), "text": ""})()
    finals = run_all(engine)
    assert finals["bad"].error is not None and finals["bad"].finished
    assert all(o.finish_reason == "abort" for o in finals["bad"].outputs)
    assert finals["victim"].error is None and finals["victim"].outputs[0].token_ids == want
    assert len(finals["other"].outputs[0].token_ids) == 8 and finals["other"].error is None
    assert_idle_and_blocks_free(engine)


def test_llm_generate_raises_the_failure_and_leaves_the_engine_clean(qwen2_dir, monkeypatch):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4)
    import nano_infer.engine.output_processor as engine_module

    monkeypatch.setattr(engine_module, "sample", Exploding())
    with pytest.raises(RuntimeError, match="failed: boom"):
        llm.generate(["To be", "or not"], greedy())
    monkeypatch.undo()
    assert_idle_and_blocks_free(llm.engine)
    assert len(llm.generate(["To be"], greedy(4))[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1e-300, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1e-6, max_tokens=8, ignore_eos=True, seed=5),
    SamplingParams(temperature=0.5, top_k=2**31 - 1, max_tokens=8, ignore_eos=True, seed=5),
])
def test_extreme_but_valid_params_work(engine, params):
    """A temperature below 1e-5 is greedy (as in vLLM); a top_k beyond the vocabulary keeps all of it."""
    got = alone(engine, "To be, or not", params)
    if params.top_k > 0:
        assert len(got) == 8
    else:
        assert got == alone(engine, "To be, or not", greedy())
    assert_idle_and_blocks_free(engine)
