"""Chapter 10's bench on the shipped model at tp=2 (gloo on CPU): the collectives of one step, and timed turns."""
import time

import pytest

from nano_infer import LLM
from nano_infer.bench.timing import Timings
from nano_infer.bench.tp import TPStepTimes, collective_calls, step_split, step_times
from nano_infer.models.loader import TINY_MODEL_DIR, load_config

pytestmark = pytest.mark.slow  # two processes per engine
LAYERS = load_config(TINY_MODEL_DIR).num_hidden_layers
KV_BLOCKS = 256  # the filler requests may each grow to max_model_len


@pytest.fixture(scope="module")
def engines():
    single = LLM(str(TINY_MODEL_DIR), dtype="float32", num_kv_blocks=KV_BLOCKS)
    with LLM(str(TINY_MODEL_DIR), dtype="float32", num_kv_blocks=KV_BLOCKS, tensor_parallel_size=2) as tp2:
        yield single, tp2


def test_one_decode_step_all_reduces_twice_per_layer_plus_the_embedding(engines):
    _, tp2 = engines
    calls = collective_calls(tp2, num_seqs=3, context=10)
    assert calls["gloo:all_reduce"] == 2 * LAYERS + 1
    assert calls["gloo:gather"] == 1  # the logits, to the driver
    assert calls["gloo:broadcast"] >= 1  # the step's inputs, to the workers
    assert not tp2.engine.requests  # the filler requests are gone


def test_step_times_take_turns_per_step_and_leave_the_engines_empty(engines, monkeypatch):
    single, tp2 = engines
    step, pause = single.engine.step, 0.05

    def slow_step():  # tp=1 made slower than any real step here, by a known amount per step
        time.sleep(pause)
        return step()

    monkeypatch.setattr(single.engine, "step", slow_step)
    t = step_times(tp2, single, rounds=3, steps=2, profiled_steps=2, num_seqs=2, context=8)
    assert (t.tp, t.rounds, t.steps) == (2, 3, 2)
    assert all(len(s) == 3 for s in t.timings.samples.values())
    assert pause <= t.single < 2 * pause  # seconds per step, not per round of 2 steps
    assert t.ratios == [a / b for a, b in zip(t.timings.samples["tp=2"], t.timings.samples["tp=1"])]
    assert 0 < t.comm_share < 1
    assert not tp2.engine.requests and not single.engine.requests
    bars = step_split([t])
    assert list(bars) == [f"tp=1, {t.threads} thread{'s' if t.threads > 1 else ''}", "tp=2"]
    assert sum(bars["tp=2"]) == pytest.approx(t.step)


def test_step_split_pools_tp1_and_orders_sizes():
    four = TPStepTimes(4, Timings({"tp=4": [0.09, 0.08, 0.10], "tp=1": [0.005, 0.007, 0.006]}), 0.75, 1, 3, 5)
    two = TPStepTimes(2, Timings({"tp=2": [0.02, 0.03, 0.02], "tp=1": [0.004, 0.009, 0.008]}), 0.5, 1, 3, 5)
    bars = step_split([four, two])
    assert list(bars) == ["tp=1, 1 thread", "tp=2", "tp=4"]
    assert bars["tp=1, 1 thread"] == pytest.approx((0.0065, 0.0))  # median of the six tp=1 rounds
    assert bars["tp=2"] == pytest.approx((0.01, 0.01)) and bars["tp=4"] == pytest.approx((0.0225, 0.0675))
