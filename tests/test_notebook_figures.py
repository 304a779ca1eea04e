"""Every figure committed in a notebook shows without JavaScript (GitHub, nbconvert --to html).

A plotly output must carry a static image beside its interactive JSON (`make notebooks` stores
it), and no output may fetch code from the network to draw.
"""
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
IMAGES = ("image/png", "image/svg+xml")


def outputs(path):
    nb = nbformat.read(path, as_version=4)
    for n, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            yield n, out.get("data", {})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_output_carries_an_image(path):
    figures = [(n, data) for n, data in outputs(path) if PLOTLY in data]
    missing = [n for n, data in figures if not any(k in data for k in IMAGES)]
    assert not missing, f"{path.name}: cells {missing} hold a figure without an image; run `make notebooks`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_output_loads_a_script_from_the_network(path):
    for n, data in outputs(path):
        html = data.get("text/html", "")
        html = "".join(html) if isinstance(html, list) else html
        assert not ("<script" in html and "https://" in html), f"{path.name} cell {n}: a script from the network"
