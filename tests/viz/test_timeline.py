"""Chapter 05-06 figures: the Gantt segments are built right from a step history."""
import pytest

from nano_infer import LLM, SamplingParams
from nano_infer.engine.memory import StepRecord
from nano_infer.viz.timeline import (attention_scaling_figure, classify, lifecycle_figure, per_request_figure, schedule_gantt,
                                     schedule_segments)


def record(step, scheduled, running=1, waiting=0, preempted=0):
    return StepRecord(step=step, start=float(step), end=step + 1.0, scheduled=scheduled, num_running=running,
                      num_waiting=waiting, num_preempted=preempted, kv_reserved_bytes=0, kv_used_bytes=0,
                      num_free_blocks=0, num_cached_blocks=0)


def test_segments_merge_decodes_and_spot_recompute():
    history = [
        record(0, [("a", 0, 8, "prefill")]),
        record(1, [("a", 0, 1, "decode"), ("b", 0, 5, "prefill")]),
        record(2, [("a", 0, 1, "decode"), ("b", 0, 3, "prefill")]),  # b's second chunk
        record(3, [("b", 0, 1, "decode")]),  # a was preempted
        record(4, [("b", 0, 1, "decode"), ("a", 0, 10, "prefill")]),  # a recomputes prompt + its 2 tokens
        record(5, [("a", 0, 1, "decode")]),  # a's last decode
    ]
    segments = schedule_segments(history)
    assert [(s["label"], s["kind"], s["start"], s["end"], s["tokens"]) for s in segments] == [
        ("a", "prefill", 0, 1, 8),
        ("a", "decode", 1, 3, 2),
        ("b", "prefill", 1, 2, 5),
        ("b", "prefill", 2, 3, 3),
        ("b", "decode", 3, 5, 2),
        ("a", "recompute", 4, 5, 10),
        ("a", "decode", 5, 6, 1),
    ]
    assert [sum(n for _, n, _ in row) for row in classify(history)] == [8, 6, 4, 1, 11, 1]


def test_gantt_shows_every_request_and_the_budget():
    history = [record(0, [("a", 0, 4, "prefill"), ("b", 1, 3, "prefill")]), record(1, [("a", 0, 1, "decode")])]
    fig = schedule_gantt(history, budget=8)
    gantt = [t for t in fig.data if t.orientation == "h"]
    assert {y for t in gantt for y in t.y} == {"a", "b/1"}
    per_step = [t for t in fig.data if t.orientation != "h"]
    assert sorted(sum(t.y[i] for t in per_step) for i in range(2)) == [1, 7]
    assert any(shape.y0 == 8 for shape in fig.layout.shapes)


def test_lifecycle_counts_add_up():
    history = [record(0, [("a", 0, 4, "prefill")], running=2, waiting=3), record(1, [], running=1, waiting=1, preempted=1)]
    fig = lifecycle_figure(history, num_requests=5)
    by_name = {t.name: list(t.y) for t in fig.data}
    assert by_name["finished"] == [0, 3] and by_name["running"] == [2, 1] and by_name["waiting"] == [3, 1]
    assert list(by_name["a preemption"]) == [5]


def test_attention_scaling_figure_has_both_panels():
    rows = [dict(impl=i, context=c, ms=1.0, mib=2.0) for i in ("gather", "blockwise") for c in (128, 256)]
    fig = attention_scaling_figure(rows)
    assert len(fig.data) == 4 and {t.name for t in fig.data} == {"gather", "blockwise"}


def test_real_engine_history(qwen2_dir):
    """On a real run: each request's decodes form one unbroken run of max_tokens - 1 steps."""
    llm = LLM(str(qwen2_dir), dtype="float32", record_steps=True, max_num_batched_tokens=16, max_num_seqs=3)
    prompts = [[5] * 30, [6] * 4, [7] * 9, [8] * 3]
    llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    segments = schedule_segments(llm.engine.history)
    for rid in ("0", "1", "2", "3"):
        decodes = [s for s in segments if s["label"] == rid and s["kind"] == "decode"]
        assert len(decodes) == 1 and decodes[0]["tokens"] == 4, (rid, segments)
    prefill_chunks = [s for s in segments if s["label"] == "0" and s["kind"] == "prefill"]
    assert sum(s["tokens"] for s in prefill_chunks) == 30 and len(prefill_chunks) >= 2


@pytest.mark.parametrize("budget", [None, 5])
def test_gantt_without_work_is_empty_but_valid(budget):
    fig = schedule_gantt([record(0, [])], budget=budget)
    assert all(t.orientation != "h" for t in fig.data)


def test_per_request_figure_one_line_per_run():
    fig = per_request_figure({"static": [3, 9, 1], "continuous": [1, 1, 2]}, y_title="steps", title="t")
    assert [t.name for t in fig.data] == ["static", "continuous"] and list(fig.data[0].x) == [0, 1, 2]
