"""Build the static site of the executed notebooks: `python book/build.py [out_dir]` (make book).

It stages the sources in build/book-src and runs Sphinx with MyST-NB (which renders the outputs
stored in the notebooks, executing nothing):
- index.md: the README with a table of contents;
- every notebooks/NN_*.ipynb, each plotly output turned into a div drawn by the plotly.js that
  ships inside the plotly package (copied to _static, so no page needs the network), each live
  widget replaced by a note (widgets need a kernel) that points at the figure drawn just before
  it: a widget with no such picture (a progress bar, a slider whose figure is not stored) stops
  the build, since the page would show a note about nothing;
- one page per reference solution solutions/NN_*.py.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import plotly
import plotly.io as pio

ROOT = Path(__file__).resolve().parent.parent
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
IMAGES = ("image/png", "image/svg+xml", "image/jpeg")
WIDGET_NOTE = "*Live sliders: open this notebook in JupyterLab to move them. The figure above is the same picture for fixed settings.*"


def widgets_without_picture(nb) -> list[str]:
    """Widget outputs with no figure right before them: in their cell, or as the last output of the cell
    just above (no prose in between).

    A live widget needs a kernel; the book shows the figure drawn just before it instead (the
    same picture for fixed settings). A widget nothing stands in for is an error in the notebook.
    """
    problems, picture = [], False
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            picture = False  # prose in between: the figure above is no longer the widget's
            continue
        before = picture  # the previous code cell with outputs ended on a figure
        picture = False
        for out in cell.outputs:
            data = out.get("data", {})
            if WIDGET in data:
                if not (picture or before):
                    text = "".join(data.get("text/plain", ""))[:60]
                    problems.append(f"cell {n}: a widget with no figure before it ({text!r})")
                continue
            if PLOTLY in data or any(k in data for k in IMAGES):
                picture = True
            elif out.get("output_type") != "stream" or out.get("name") != "stderr":
                picture, before = False, False  # a table or text in between: the figure is not the widget's
    return problems


def figure_html(figure: dict) -> str:
    """A plotly figure (JSON of a notebook output) as a div and the script that draws it with the page's plotly.js."""
    return pio.to_html(figure, include_plotlyjs=False, full_html=False, validate=False, auto_play=False,
                       config={"displaylogo": False})


def is_cdn_loader(output) -> bool:
    """An output that only loads a script from the network (older plotly renderers emit one)."""
    html = output.get("data", {}).get("text/html", "")
    html = "".join(html) if isinstance(html, list) else html
    return PLOTLY not in output.get("data", {}) and "<script" in html and "https://" in html


def stage_notebook(src: Path, dst: Path) -> dict[str, int]:
    """Copy a notebook with book-ready outputs; returns how many plotly figures it holds, and how many steppers."""
    nb = nbformat.read(src, as_version=4)
    nb.metadata.pop("widgets", None)
    orphans = widgets_without_picture(nb)
    if orphans:
        raise ValueError(f"{src.name}: {'; '.join(orphans)}. Keep such output out of the notebook (e.g. no "
                         "progress bars), or draw the widget's figure before it")
    figures = steppers = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.outputs:
            data = out.get("data", {})
            if PLOTLY in data:
                figures += 1
                steppers += bool(data[PLOTLY].get("layout", {}).get("sliders"))
                out["data"] = {"text/html": figure_html(data[PLOTLY]), "text/plain": "<plotly figure>"}
            elif WIDGET in data:
                out["data"] = {"text/markdown": WIDGET_NOTE, "text/plain": WIDGET_NOTE}
            elif is_cdn_loader(out):
                continue
            outputs.append(out)
        cell.outputs = outputs
    nbformat.write(nb, dst)
    return {"figures": figures, "steppers": steppers}


def solution_page(src: Path) -> str:
    title = src.stem.replace("_", " ", 1).replace("_", " ")
    return (f"# Solutions · {title}\n\nReference solutions to the exercises of notebook {src.stem[:2]} "
            f"(`solutions/{src.name}`); `check.<name>(...)` from `nano_infer.exercises` accepts each.\n\n"
            f"```{{literalinclude}} {src.name}\n:language: python\n```\n")


def landing_page(notebooks: list[str], solutions: list[str]) -> str:
    """The README, its chapter table linked to the notebook pages, then the table of contents."""
    readme = (ROOT / "README.md").read_text()
    pages = {name[:2]: name for name in notebooks}
    readme = re.sub(r"^\| (\d\d) \| ([^|]+?) \|",
                    lambda m: f"| {m[1]} | [{m[2]}]({pages[m[1]]}.ipynb) |" if m[1] in pages else m[0],
                    readme, flags=re.MULTILINE)
    tocs = "\n```{toctree}\n:caption: Notebooks\n:maxdepth: 1\n\n" + "\n".join(notebooks) + "\n```\n"
    if solutions:
        tocs += "\n```{toctree}\n:caption: Exercise solutions\n:maxdepth: 1\n\n" + "\n".join(solutions) + "\n```\n"
    return readme + "\n" + tocs


def stage(src_dir: Path) -> dict[str, dict[str, int]]:
    """Write the Sphinx sources; returns figures and steppers per notebook page (the browser test's expectation)."""
    shutil.rmtree(src_dir, ignore_errors=True)
    (src_dir / "_static").mkdir(parents=True)
    (src_dir / "solutions").mkdir()
    for name in ("conf.py", "favicon.svg"):
        shutil.copy(ROOT / "book" / name, src_dir)
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", src_dir / "_static")
    figures = {}
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        figures[nb.stem] = stage_notebook(nb, src_dir / nb.name)
    solutions = []
    for py in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        shutil.copy(py, src_dir / "solutions" / py.name)
        (src_dir / "solutions" / f"{py.stem}.md").write_text(solution_page(py))
        solutions.append(f"solutions/{py.stem}")
    (src_dir / "index.md").write_text(landing_page(list(figures), solutions))
    (src_dir / "figures.json").write_text(json.dumps(figures, indent=1))
    return figures


def main(out_dir: str = "build/book") -> None:
    src_dir = ROOT / "build" / "book-src"
    stage(src_dir)
    subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src_dir),
                    str(ROOT / out_dir)], check=True)
    shutil.copy(src_dir / "figures.json", ROOT / out_dir / "figures.json")
    print(f"book: {ROOT / out_dir / 'index.html'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
