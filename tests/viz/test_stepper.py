"""The stepper: one plotly figure whose frames are the states, so stepping needs no kernel."""
import plotly.graph_objects as go
import pytest

from nano_infer.viz import stepper


def _bars(i):
    fig = go.Figure(go.Bar(x=["a", "b"], y=[i, 2 * i]))
    fig.update_layout(title=f"state {i}", height=300 + 10 * i)
    if i == 1:
        fig.add_annotation(x="a", y=1, text="here")
    return fig


def test_frames_carry_each_state_and_the_slider_names_them():
    fig = stepper(_bars, 3, "step", labels=["x", "y", "z"])
    assert [list(f.data[0].y) for f in fig.frames] == [[0, 0], [1, 2], [2, 4]]
    assert [f.layout.title.text for f in fig.frames] == ["state 0", "state 1", "state 2"]
    # every state lists as many notes (plotly.js merges them item by item); state 2 hides state 1's
    assert [[a.text for a in f.layout.annotations if a.visible] for f in fig.frames] == [[], ["here"], []]
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["x", "y", "z"]
    assert [list(s.args[0]) for s in steps] == [[f.name] for f in fig.frames]
    assert fig.layout.height >= 320  # room for the tallest state


def test_states_must_draw_the_same_traces():
    def draw(i):
        return go.Figure(go.Bar(y=[1])) if i == 0 else go.Figure(go.Scatter(y=[1]))

    with pytest.raises(ValueError, match="state 1 draws"):
        stepper(draw, 2)
    with pytest.raises(ValueError, match="at least 1"):
        stepper(_bars, 0)
    with pytest.raises(ValueError, match="labels"):
        stepper(_bars, 2, labels=["only one"])
