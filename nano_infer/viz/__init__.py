"""Plotly figures and ipywidgets steppers for the notebooks, one file per chapter's pictures.

Import from the submodule that draws what you need, e.g. `from nano_infer.viz.memory import ...`.
"""
from __future__ import annotations

import inspect


def show_source(obj) -> None:
    """Display the real source of a nano_infer function or class (never a copy that can drift)."""
    from IPython.display import Code, display

    display(Code(inspect.getsource(obj), language="python"))


def stepper(draw, count: int, description: str = "step", interval_ms: int = 500):
    """A slider (with a play button) over `count` states; `draw(i)` returns the figure for state i."""
    import ipywidgets as w
    from IPython.display import display

    if count < 1:
        raise ValueError("nothing to step through")
    slider = w.IntSlider(value=0, min=0, max=count - 1, description=description)
    play = w.Play(value=0, min=0, max=count - 1, interval=interval_ms)
    w.jslink((play, "value"), (slider, "value"))
    out = w.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            display(draw(slider.value))

    slider.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([play, slider]), out])


__all__ = ["show_source", "stepper"]
