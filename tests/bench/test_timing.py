"""Interleaved timing: every variant once per round, rotated order, warm-up rounds dropped, paired ratios."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nano_infer.bench.timing import Timings, interleaved, one_thread, verdict


def test_rounds_run_every_variant_in_rotated_order_and_drop_the_warmup():
    calls = []
    t = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "c": lambda: calls.append("c")},
                    rounds=3, warmup=1)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {name: len(s) for name, s in t.samples.items()} == {"a": 3, "b": 3, "c": 3}


def test_ratio_is_the_ratio_of_the_medians_printed_beside_it():
    t = Timings({"slow": [2.0, 40.0, 3.0], "fast": [1.0, 10.0, 2.0]})  # a busy second round slowed both
    assert t.median("slow") == 3.0 and t.median("fast") == 2.0
    assert t.ratio("slow", "fast") == 1.5  # not 2.0, the median of the per-round ratios 2, 4, 1.5
    assert t.ratios("slow", "fast") == [2.0, 4.0, 1.5]


@given(st.lists(st.tuples(st.floats(1e-3, 1e3), st.floats(1e-3, 1e3)), min_size=1, max_size=9))
def test_the_medians_ratio_lies_within_the_rounds_so_it_never_contradicts_the_verdict(rounds):
    c = Timings({"a": [a for a, _ in rounds], "b": [b for _, b in rounds]}).compare("a", "b", 1.0, "a slower", "a faster")
    assert min(c.ratios) * (1 - 1e-9) <= c.ratio <= max(c.ratios) * (1 + 1e-9)
    assert c.verdict != "a slower" or c.ratio > 1
    assert c.verdict != "a faster" or c.ratio < 1


def test_a_comparison_prints_the_medians_their_ratio_the_rounds_and_the_verdict():
    c = Timings({"int4": [0.030, 0.012, 0.010], "dense": [0.010, 0.005, 0.004]}).compare(
        "int4", "dense", 1.0, "dense faster", "int4 faster")
    assert c.text() == "int4 12.00 ms / dense 5.00 ms = 2.40x (rounds 2.40-3.00) -> dense faster"
    assert c.text(unit="s", scale=1, digits=3) == "int4 0.012 s / dense 0.005 s = 2.40x (rounds 2.40-3.00) -> dense faster"
    assert Timings({"a": [1.0, 3.0], "b": [2.0, 2.0]}).compare("a", "b").text().endswith("(rounds 0.50-1.50)")  # no verdict asked


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
