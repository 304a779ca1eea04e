"""Interleaved timing: every variant once per round, rotated order, warm-up rounds dropped, paired ratios."""
import pytest
import torch

from nano_infer.bench.timing import Timings, interleaved, one_thread, verdict


def test_rounds_run_every_variant_in_rotated_order_and_drop_the_warmup():
    calls = []
    t = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "c": lambda: calls.append("c")},
                    rounds=3, warmup=1)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {name: len(s) for name, s in t.samples.items()} == {"a": 3, "b": 3, "c": 3}


def test_ratio_is_the_median_of_per_round_ratios():
    t = Timings({"slow": [2.0, 40.0, 3.0], "fast": [1.0, 10.0, 1.0]})  # a busy second round slowed both
    assert t.ratio("slow", "fast") == 3.0
    assert t.median("slow") == 3.0


def test_rounds_must_be_positive():
    with pytest.raises(ValueError, match="rounds"):
        interleaved({"a": lambda: None}, rounds=0)


def test_one_thread_restores_the_setting():
    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_setup_runs_untimed_before_each_call():
    import time

    calls = []
    t = interleaved({"a": lambda: calls.append("a")}, rounds=2, warmup=0,
                    setup=lambda name: (calls.append(f"setup {name}"), time.sleep(0.05)), clock=time.perf_counter)
    assert calls == ["setup a", "a", "setup a", "a"]
    assert max(t.samples["a"]) < 0.04  # the sleep in setup is not timed


def test_verdict_is_inconclusive_when_the_rounds_straddle_the_threshold():
    assert verdict([1.6, 1.8, 2.1], 1.0, "pays", "does not pay") == "pays"
    assert verdict([0.7, 0.9], 1.0, "pays", "does not pay") == "does not pay"
    assert verdict([0.6, 1.45, 2.53], 1.0, "pays", "does not pay") == "inconclusive"  # median 1.45 alone would say "pays"
