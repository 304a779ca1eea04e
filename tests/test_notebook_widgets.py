"""No widget output reaches the book without its picture.

A live widget needs a kernel: the book (book/build.py) shows the figure drawn just before it and a
note. A widget with no figure before it (a progress bar stored as a widget, chapter 09's GGUF
loading) would leave a note about nothing, so the build refuses it; this checks the committed
notebooks the same way without building the book.
"""
import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WIDGET = {"application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2, "version_minor": 0},
          "text/plain": "Converting and de-quantizing GGUF tensors...:   0%|"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_widget_output_follows_its_picture(path):
    assert build.widgets_without_picture(nbformat.read(path, as_version=4)) == []


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    for outputs in cells:
        cell = nbformat.v4.new_code_cell("x")
        cell.outputs = [nbformat.from_dict(o) for o in outputs]
        nb.cells.append(cell)
    return nb


def test_a_progress_bar_has_no_picture_and_a_slider_after_its_figure_has():
    figure = {"output_type": "display_data", "metadata": {}, "data": {"image/png": "iVBOR", "text/plain": "<fig>"}}
    widget = {"output_type": "display_data", "metadata": {}, "data": WIDGET}
    text = {"output_type": "stream", "name": "stdout", "text": "a table\n"}
    assert len(build.widgets_without_picture(_nb([text, widget, widget]))) == 2
    assert build.widgets_without_picture(_nb([figure], [widget])) == []  # chapter 00: the figure, then its sliders
    assert build.widgets_without_picture(_nb([figure, widget])) == []
    assert len(build.widgets_without_picture(_nb([figure], [text, widget]))) == 1
    with pytest.raises(ValueError, match="widget with no figure"):
        nb = _nb([text, widget])
        path = ROOT / "build" / "test-widget.ipynb"
        path.parent.mkdir(exist_ok=True)
        nbformat.write(nb, path)
        try:
            build.stage_notebook(path, path.with_name("test-widget-staged.ipynb"))
        finally:
            path.unlink()
