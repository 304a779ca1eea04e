"""A stepper frame draws only its own annotations: plotly.js merges a frame's notes into the figure's
item by item, so a state with fewer notes must hide the rest (tests/helpers/plotly_frames.py)."""
import plotly.graph_objects as go

from nano_infer.kv.host_tier import HostTierStats
from nano_infer.viz import stepper
from nano_infer.viz.tiers import CACHED, FREE, HOST_CACHED, RUNNING, TierSnapshot, tier_stepper
from tests.helpers.plotly_frames import drawn, merge_layout, stale_items


def _notes(i):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[i, i]))
    for n in range(3 if i == 0 else 1 if i == 1 else 0):
        fig.add_annotation(x=n, y=i, text=f"state {i} note {n}", showarrow=True, ax=0, ay=0)
    if i == 2:
        fig.add_shape(type="rect", x0=0, x1=1, y0=0, y1=1)
    return fig


def test_the_merge_model_keeps_the_items_a_shorter_list_leaves_out():
    base = {"annotations": [{"text": "a"}, {"text": "b"}, {"text": "c"}]}
    after = merge_layout(base, {"annotations": [{"text": "x"}]})
    assert [a["text"] for a in after["annotations"]] == ["x", "b", "c"]  # what plotly.js keeps drawn
    assert len(drawn(after)) == 3


def test_each_frame_draws_only_its_own_notes_and_shapes():
    fig = stepper(_notes, 3).to_plotly_json()
    assert stale_items(fig) == []
    layout = fig["layout"]
    for i in (0, 1, 2, 1, 0, 2, 0):
        layout = merge_layout(layout, fig["frames"][i]["layout"])
        assert sorted(a["text"] for a in layout["annotations"] if a.get("visible") is not False) == \
            [f"state {i} note {n}" for n in range(3 if i == 0 else 1 if i == 1 else 0)]
        assert len([s for s in layout["shapes"] if s.get("visible") is not False]) == (i == 2)


def _snapshot(step, offloads):
    device = [RUNNING, RUNNING, CACHED, FREE]
    host = [HOST_CACHED] * len(offloads) + [0] * (4 - len(offloads))
    return TierSnapshot(step=step, device=device, host=host, offloads=offloads,
                        scheduled=[("0", 1, "decode")], stats=HostTierStats())


def test_the_tier_stepper_drops_the_arrows_of_the_step_before():
    # chapter 12: step 24 copied three blocks, step 107 none; at step 107 no arrow may be left
    fig = tier_stepper([_snapshot(24, [(0, 0), (1, 1), (2, 2)]), _snapshot(107, [])], columns=4).to_plotly_json()
    assert stale_items(fig) == []
    layout = merge_layout(merge_layout(fig["layout"], fig["frames"][0]["layout"]), fig["frames"][1]["layout"])
    arrows = [a for a in layout["annotations"] if a.get("showarrow") and a.get("visible") is not False]
    assert arrows == []
