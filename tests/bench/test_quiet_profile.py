"""The profiler's USDT start/stop lines are dropped from stderr; everything else written there still arrives."""
import os

import torch

from nano_infer.bench.quiet_profile import profiled, top_ops, without_usdt_lines


def test_plain_profiler_prints_usdt_lines(capfd):
    """The noise this module removes (if torch stops printing it, the module has no job left)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.ones(4).sum()
    err = capfd.readouterr().err
    assert "USDT:" in err and "profiler_start" in err and "profiler_stop" in err


def test_profiled_drops_them_and_still_records(capfd):
    with profiled() as prof:
        torch.ones(4).sum()
    assert "aten::sum" in {e.key for e in prof.key_averages()}
    assert "USDT" not in capfd.readouterr().err


def test_other_lines_on_descriptor_2_are_kept_in_order(capfd):
    with without_usdt_lines():
        os.write(2, b"first real error\nUSDT:2026-01-01 00:00:00 1:1 X.cpp:52] profiler_start\nsecond line\n")
    assert capfd.readouterr().err == "first real error\nsecond line\n"


def test_output_of_the_profiled_block_goes_out_as_it_happens(capfd):
    """Only the profiler's start and stop are filtered: a crash inside the block loses none of its message."""
    with profiled():
        os.write(2, b"written inside\n")
        assert capfd.readouterr().err == "written inside\n"


def test_top_ops_is_the_profile_table_narrow_enough_for_a_notebook():
    from nano_infer.viz import TEXT_COLUMNS

    x = torch.randn(64, 64)
    with profiled() as prof:
        for _ in range(3):
            torch.nn.functional.scaled_dot_product_attention(x[None], x[None], x[None]).relu().sum()
    table = top_ops(prof, rows=4)
    ops = prof.key_averages()
    own = sum(e.self_cpu_time_total for e in ops)
    first = max(ops, key=lambda e: e.self_cpu_time_total)
    assert len(table) == 4 and table["op"][0] == first.key and table["calls"][0] == first.count
    assert abs(table["self %"][0] - 100 * first.self_cpu_time_total / own) <= 0.05
    assert list(table["self ms"]) == sorted(table["self ms"], reverse=True)
    assert max(map(len, table.to_string(index=False).splitlines())) <= TEXT_COLUMNS
    assert max(map(len, prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=4).splitlines())) > TEXT_COLUMNS
