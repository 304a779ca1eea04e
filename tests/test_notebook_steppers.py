"""Every stepper committed in a notebook draws, at each stop of its slider, only that stop's notes.

plotly.js merges a frame's annotations and shapes into the figure's item by item, so a frame
with fewer than the one before leaves the rest drawn (chapter 12's copy arrows stayed for a
hundred steps). tests/helpers/plotly_frames.py computes what is drawn after each move.
"""
from pathlib import Path

import nbformat
import pytest

from tests.helpers.plotly_frames import stale_items

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_stepper_frame_draws_only_its_own_annotations(path):
    nb = nbformat.read(path, as_version=4)
    problems = []
    for n, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            figure = out.get("data", {}).get(PLOTLY)
            if figure and figure.get("frames"):
                problems += [f"cell {n}: {p}" for p in stale_items(figure)[:3]]
    assert not problems, f"{path.name}: {problems}; re-run the notebook (make notebooks NB={path.relative_to(path.parents[1])})"
