"""Chapter 14 figures: K and V channel by channel with their rounding errors, and scheduler timelines side by side."""
import torch

from nano_infer.engine.memory import StepRecord
from nano_infer.viz.kv_quant import channel_figure, channel_labels, running_side_by_side


def test_channel_figure_draws_both_tensors_and_an_error_line_per_choice_of_scales():
    k, v = torch.randn(8, 2, 4), torch.randn(8, 2, 4)
    k[:, 1, 3] *= 20  # an outlier channel: head 1, channel 3
    errors = {name: {"per token": torch.rand(8), "per channel": torch.rand(8)} for name in ("K", "V")}
    fig = channel_figure(k, v, errors)
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(heatmaps) == 2 and len(lines) == 4
    z = torch.tensor(heatmaps[0].z)
    assert z.shape == (8, 8) and int(z.mean(0).argmax()) == 7  # h1 c3 is column 1 * 4 + 3
    assert [t.name for t in lines if t.showlegend] == ["per token", "per channel"]  # one legend entry each
    assert channel_labels(2, 4)[7] == "h1 c3"


def record(step, running, waiting, preempted=0):
    return StepRecord(step=step, start=float(step), end=step + 1.0, scheduled=[], num_running=running,
                      num_waiting=waiting, num_preempted=preempted, kv_reserved_bytes=0, kv_used_bytes=0,
                      num_free_blocks=0, num_cached_blocks=0)


def test_runs_side_by_side_share_the_step_axis_and_name_their_preemptions():
    tight = [record(0, 2, 2), record(1, 1, 3, preempted=1), record(2, 2, 1), record(3, 1, 0), record(4, 0, 0)]
    roomy = [record(0, 4, 0), record(1, 2, 0), record(2, 0, 0)]
    fig = running_side_by_side({"bfloat16": tight, "int8": roomy}, num_requests=4)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["bfloat16: 5 steps, 1 preemption", "int8: 3 steps, 0 preemptions"]
    assert fig.layout.xaxis.range == fig.layout.xaxis2.range == (0, 5)
    assert sum(1 for t in fig.data if t.name == "a preemption") == 1
    assert sorted(t.name for t in fig.data if t.showlegend) == ["a preemption", "finished", "running", "waiting"]
