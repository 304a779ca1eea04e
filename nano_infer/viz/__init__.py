"""Plotly figures for the notebooks, one file per chapter's pictures, and the stepper they share.

Import from the submodule that draws what you need, e.g. `from nano_infer.viz.memory import ...`.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path

import plotly.graph_objects as go

# JupyterLab 4 in a 1280 px window with the file browser open (its default 250 px) gives a notebook's outputs 848 px;
# a wider figure is cut off there (and its PNG too). Text draws in the code font at 13 px (DejaVu Sans Mono on Linux:
# 7.83 px a character) after one character of padding and wraps (pre-wrap) past 107 characters.
# tests/test_notebook_fit.py draws every committed figure at OUTPUT_WIDTH in Chromium and measures both.
OUTPUT_WIDTH = 848
FIGURE_WIDTH = 820  # a figure that sets its width: the output area less room for a vertical scroll bar
TEXT_COLUMNS = 107
# A legend under the plot, below the x axis's labels and title whatever they take (the figure's bottom margin
# grows to hold it), in rows as wide as the plot: `fig.update_layout(width=FIGURE_WIDTH, legend=LEGEND_BELOW)`.
# A legend at the right takes the plot's width, and at 900 px went past the output area's edge.
LEGEND_BELOW = dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left")

# Layout keys a frame may change: what a state says (title, annotations, shapes) and where its axes look.
_FRAME_LAYOUT_KEYS = ("title", "annotations", "shapes")


def source_listing(obj, start: str | None = None) -> str:
    """`obj`'s real source under a line saying where it lives (file, line range). With `start`, only
    from its first line containing `start` to its end (a worker's loop without its set-up); a
    ValueError when no line contains it, so an edited function breaks the chapter instead of
    showing some other part of it. A decorated function (for example under
    `@torch.inference_mode()`) shows its own source, not the decorator's wrapper."""
    obj = inspect.unwrap(obj)
    lines, first = inspect.getsourcelines(obj)
    at, of = 0, ""
    if start is not None:
        at = next((i for i, line in enumerate(lines) if start in line), None)
        if at is None:
            raise ValueError(f"no line of {obj.__qualname__} contains {start!r}")
        of = f" (of {obj.__qualname__})"
    path = Path(inspect.getsourcefile(obj)).resolve()
    package_root = Path(__file__).resolve().parents[2]
    where = path.relative_to(package_root) if path.is_relative_to(package_root) else path.name
    return f"# {where}, lines {first + at}-{first + len(lines) - 1}{of}\n" + "".join(lines[at:])


def show_source(obj, collapsed: bool = False, start: str | None = None) -> None:
    """Display the real source of a nano_infer function or class (never a copy that can drift).

    `collapsed=True` folds a long listing into a block the reader opens with a click, for code
    the prose only mentions; `start` shows only the part from that line on (`source_listing`).
    """
    from IPython.display import HTML, Code, display

    text = source_listing(obj, start)
    code = Code(text, language="python")
    if not collapsed:
        display(code)
        return
    name = getattr(obj, "__qualname__", str(obj))
    display(HTML(f"<details><summary><code>{name}</code>: {text.count(chr(10)) - 1} lines, click to show</summary>"
                 f"{code._repr_html_()}</details>"))


def figure_renderer() -> str:
    """The plotly renderer a notebook's setup cell uses: `pio.renderers.default = figure_renderer()`.

    Always plotly's own JSON, which JupyterLab, VS Code and the book draw interactively (nothing
    loaded from a CDN). With NANO_INFER_FIGURE_IMAGES=1 (`make notebooks`, when outputs are
    executed for committing) also a PNG of each figure, so a viewer that runs no JavaScript
    (GitHub, `nbconvert --to html`) shows it; that needs kaleido and a Chromium, which `make test`
    does without.
    """
    return "plotly_mimetype+png" if os.environ.get("NANO_INFER_FIGURE_IMAGES") == "1" else "plotly_mimetype"


def _frame_layout(fig: go.Figure, counts: dict[str, int]) -> dict:
    """The layout keys a frame sets, its annotations and shapes padded to `counts` entries.

    plotly.js merges a frame's annotations and shapes into the figure's item by item (as it does
    any layout array), so the items past the end of a shorter list would stay drawn: a state
    with two notes after one with five would still show the last three. Every state therefore
    lists the same number, the missing ones hidden, and its own ones visible (a merged item
    keeps `visible` from the item it replaces unless the frame says otherwise).
    """
    layout = fig.layout.to_plotly_json()
    keep = {k: v for k, v in layout.items() if k in _FRAME_LAYOUT_KEYS or k.startswith(("xaxis", "yaxis"))}
    for key, count in counts.items():
        items = [{**item, "visible": item.get("visible", True)} for item in keep.get(key, [])]
        keep[key] = items + [{"visible": False}] * (count - len(items))
    return keep


def table_text(frame, width: int = TEXT_COLUMNS, keep: int = 1, **to_string) -> str:
    """`frame.to_string(index=False)` in blocks of columns no wider than `width` characters, each block
    repeating the first `keep` columns (which row it is), so a wide table does not wrap in a notebook's
    output area (TEXT_COLUMNS at 1280 px with JupyterLab's file browser open). `to_string`: pandas' options
    (float_format, ...). A frame that fits comes back as one block, exactly `frame.to_string(index=False)`."""
    text = frame.to_string(index=False, **to_string)
    if max(map(len, text.splitlines()), default=0) <= width or frame.shape[1] <= keep + 1:
        return text
    names = list(frame.columns)
    blocks, current = [], []
    for name in names[keep:]:
        trial = frame[names[:keep] + current + [name]].to_string(index=False, **to_string)
        if current and max(map(len, trial.splitlines())) > width:
            blocks.append(current)
            current = []
        current.append(name)
    blocks.append(current)
    return "\n\n".join(frame[names[:keep] + block].to_string(index=False, **to_string) for block in blocks)


def stepper(draw, count: int, description: str = "step", interval_ms: int = 500,
            labels: list[str] | None = None) -> go.Figure:
    """One plotly figure with a frame per state, a slider and a play button: it steps with no kernel.

    `draw(i)` returns the figure for state i; every state must draw the same traces in the same
    order (a frame replaces each trace's data, it cannot add or drop one). The figure first shows
    state 0, at the tallest state's height. `labels` name the slider's stops (default 0, 1, ...).
    """
    if count < 1:
        raise ValueError("stepper: count must be at least 1 (nothing to step through)")
    labels = [str(label) for label in labels] if labels is not None else [str(i) for i in range(count)]
    if len(labels) != count:
        raise ValueError(f"stepper: {len(labels)} labels for {count} states")
    figures = [draw(i) for i in range(count)]
    kinds = [t.type for t in figures[0].data]
    for i, f in enumerate(figures):
        if [t.type for t in f.data] != kinds:
            raise ValueError(f"stepper: state {i} draws traces {[t.type for t in f.data]}, state 0 draws {kinds}")
    counts = {key: max(len(f.layout[key]) for f in figures) for key in ("annotations", "shapes")}
    frames = [_frame_layout(f, counts) for f in figures]
    fig = go.Figure(figures[0])
    fig.update_layout(annotations=frames[0]["annotations"], shapes=frames[0]["shapes"])
    fig.frames = [go.Frame(data=f.data, layout=layout, name=str(i)) for i, (f, layout) in enumerate(zip(figures, frames))]
    height = max(f.layout.height or 450 for f in figures)
    bottom = (fig.layout.margin.b if fig.layout.margin.b is not None else 60) + 90
    still = {"mode": "immediate", "frame": {"duration": 0, "redraw": True}, "transition": {"duration": 0}}
    fig.update_layout(
        height=height + 90, margin_b=bottom,
        sliders=[dict(
            active=0, x=0.1, len=0.9, y=0, yanchor="top", pad=dict(t=50),
            currentvalue=dict(prefix=f"{description} ", font=dict(size=13)),
            steps=[dict(method="animate", label=label, args=[[str(i)], still]) for i, label in enumerate(labels)])],
        updatemenus=[dict(
            type="buttons", direction="left", x=0.1, y=0, xanchor="right", yanchor="top", pad=dict(t=60, r=10),
            showactive=False,
            buttons=[dict(label="▶", method="animate",
                          args=[None, {**still, "frame": {"duration": interval_ms, "redraw": True}, "fromcurrent": True}]),
                     dict(label="❚❚", method="animate", args=[[None], still])])],
    )
    return fig


__all__ = ["FIGURE_WIDTH", "LEGEND_BELOW", "OUTPUT_WIDTH", "TEXT_COLUMNS", "figure_renderer", "show_source",
           "source_listing", "stepper", "table_text"]
