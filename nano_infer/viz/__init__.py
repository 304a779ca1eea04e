"""Plotly figures and ipywidgets steppers for the notebooks, one file per chapter's pictures.

Import from the submodule that draws what you need, e.g. `from nano_infer.viz.memory import ...`.
"""
from __future__ import annotations

import inspect


def show_source(obj) -> None:
    """Display the real source of a nano_infer function or class (never a copy that can drift)."""
    from IPython.display import Code, display

    display(Code(inspect.getsource(obj), language="python"))


__all__ = ["show_source"]
