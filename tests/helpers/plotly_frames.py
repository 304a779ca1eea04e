"""What plotly.js draws after a stepper moves to a frame, computed in Python.

`Plotly.animate` merges a frame's layout into the figure's (`Plots.extendLayout`): objects deep,
arrays replaced, except the layout's arrays of items (annotations, shapes, images, ...), which it
merges item by item, keeping the items past the end of a shorter list. A frame that lists fewer
notes than the one before it therefore leaves the extra ones drawn unless it hides them.
"""
from __future__ import annotations

import copy

ITEM_ARRAYS = ("annotations", "shapes", "images", "selections")


def _deep(dest, src):
    """plotly.js's extendDeepNoArrays: objects merged key by key, anything else (arrays too) replaced."""
    if isinstance(dest, dict) and isinstance(src, dict):
        out = dict(dest)
        for key, value in src.items():
            out[key] = _deep(out.get(key), value)
        return out
    return copy.deepcopy(src)


def merge_layout(dest: dict, src: dict) -> dict:
    """The figure's layout after a frame with layout `src` is applied to one with layout `dest`."""
    out = copy.deepcopy(dest)
    for key, value in src.items():
        if key in ITEM_ARRAYS and isinstance(value, list):
            items = list(out.get(key) or [])
            for j, item in enumerate(value):
                merged = None if item is None else _deep(items[j] if j < len(items) else None, item)
                if j < len(items):
                    items[j] = merged
                else:
                    items.append(merged)
            out[key] = items
        else:
            out[key] = _deep(out.get(key), value)
    return out


def drawn(layout: dict, key: str = "annotations") -> list[tuple]:
    """The items of `key` a layout draws (hidden ones left out), each as a comparable tuple."""
    return [tuple(sorted((k, repr(v)) for k, v in item.items() if k != "visible"))
            for item in layout.get(key) or [] if item and item.get("visible", True) is not False]


def stale_items(figure: dict) -> list[str]:
    """Step a stepper figure (plotly JSON with frames) through every frame, forwards, backwards and
    from each frame to the first; for each arrival where what is drawn differs from what the frame
    itself lists (of the arrays it sets), a line saying which frame and what."""
    frames = figure.get("frames") or []
    layout, problems = copy.deepcopy(figure.get("layout", {})), []
    order = list(range(len(frames))) + list(range(len(frames) - 1, -1, -1))
    order += [j for i in range(len(frames)) for j in (i, 0)]
    for i in order:
        own = frames[i].get("layout", {})
        layout = merge_layout(layout, own)
        for key in ("annotations", "shapes"):
            if key in own and drawn(layout, key) != drawn(own, key):
                problems.append(f"frame {frames[i].get('name', i)}: {len(drawn(layout, key))} {key} drawn, "
                                f"the frame lists {len(drawn(own, key))}")
    return problems
