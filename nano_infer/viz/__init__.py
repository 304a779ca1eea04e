"""Plotly figures and ipywidgets steppers for the notebooks, one file per chapter's pictures.

Import from the submodule that draws what you need, e.g. `from nano_infer.viz.memory import ...`.
"""
from __future__ import annotations

import inspect
from pathlib import Path


def show_source(obj, collapsed: bool = False) -> None:
    """Display the real source of a nano_infer function or class (never a copy that can drift).

    The first line says where it lives. `collapsed=True` folds a long listing into a block the
    reader opens with a click, for code the prose only mentions.
    """
    from IPython.display import HTML, Code, display

    lines, first = inspect.getsourcelines(obj)
    path = Path(inspect.getsourcefile(obj)).resolve()
    package_root = Path(__file__).resolve().parents[2]
    where = path.relative_to(package_root) if path.is_relative_to(package_root) else path.name
    code = Code(f"# {where}, lines {first}-{first + len(lines) - 1}\n" + "".join(lines), language="python")
    if not collapsed:
        display(code)
        return
    name = getattr(obj, "__qualname__", str(obj))
    display(HTML(f"<details><summary><code>{name}</code>: {len(lines)} lines, click to show</summary>"
                 f"{code._repr_html_()}</details>"))


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
