"""Every committed figure and table fits JupyterLab's output area in a 1280 px window with the file browser open.

Measured in JupyterLab 4.6 (headless Chromium, viewport 1280 x 900, the file browser open at its default 250 px):
a notebook's output area is 848 px wide, and a text output draws in `menlo, consolas, "DejaVu Sans Mono",
monospace` at 13 px (DejaVu Sans Mono on Linux: 7.83 px a character) after a padding of one character, with
`white-space: pre-wrap`: a line longer than 107 characters wraps, and a wrapped table row no longer lines up
under its header.

Each plotly figure of each committed notebook (its `application/vnd.plotly.v1+json` output) is drawn by the
installed plotly.js into an 848 px wide box that clips what overflows, in one headless Chromium, and must fit:
the figure, its legend, colour bars, sliders, buttons, titles, annotations and tick labels inside the box and
inside the figure (plotly clips what leaves its own svg), no legend scrolled (cut to fit), no legend over an axis's
labels, and every slider stop clickable (the point of its tick is the slider, inside the box). Each text output's
tables (runs of rows whose columns are parted by two or more spaces, pandas' and torch.profiler's) must fit
`TEXT_COLUMNS` characters. The browser is Debian's chromium (CHROMIUM=/path overrides; `make chromium`).
"""
from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import plotly
import pytest

from nano_infer.viz import OUTPUT_WIDTH, TEXT_COLUMNS

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CODE_FONT = 'menlo, consolas, "DejaVu Sans Mono", monospace'  # JupyterLab's --jp-code-font-family, at 13 px


@functools.cache
def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]  # nbformat's validation would take seconds for all of them


def _outputs():
    for path in NOTEBOOKS:
        for n, cell in enumerate(_cells(path)):
            for out in cell.get("outputs", []):
                yield path.stem, n, out


def _figures():
    found = []
    for name, n, out in _outputs():
        figure = out.get("data", {}).get(PLOTLY)
        if figure:
            found.append(pytest.param(figure, id=f"{name[:2]}-cell{n}"))
    return found


def _text(out) -> str:
    """What JupyterLab shows as plain text: a stream, or a result with nothing richer than text/plain."""
    if out.get("output_type") == "stream":
        text = out.get("text", "")
    else:
        data = out.get("data", {})
        text = data["text/plain"] if set(data) == {"text/plain"} else ""
    return "".join(text) if isinstance(text, list) else text


WIDE = re.compile(r"(?<=\S) {2,}(?=\S)")  # a gap between two columns
NARROW = re.compile(r"(?<=\S) (?=\S)")  # a gap between two words


def table_lines(text: str) -> list[str]:
    """The lines of `text` that belong to a table: a row parts more of its cells by two or more spaces than by one
    (`  4     3.3  1.16` but not `tp=2:  30.0 ms per step, ...`), and a run of consecutive lines of one length
    that holds such a row is one table (pandas pads every row of a frame to one width, long text cells too)."""
    lines = text.splitlines()
    row = [len(WIDE.findall(line)) >= 2 and len(WIDE.findall(line)) >= len(NARROW.findall(line)) for line in lines]
    i = 0
    while i < len(lines):
        j = i
        while j + 1 < len(lines) and lines[j + 1].strip() and len(lines[j + 1]) == len(lines[i]):
            j += 1
        if j > i and any(row[i:j + 1]):
            row[i:j + 1] = [True] * (j + 1 - i)
        i = j + 1
    return [line for line, is_row in zip(lines, row) if is_row]


def test_table_lines_finds_tables_and_leaves_sentences():
    frame = " k  beam ms  greedy ms\n 4      3.3       3.01\n 8      4.0       3.01"
    assert table_lines(frame) == frame.splitlines()
    assert table_lines("tp=2:  30.0 ms per step, collectives  52% of it; tp=1 in the same rounds  6.9 ms") == []
    texts = "                       text  tokens  score\nO, my good lord, I am a man      19  -1.66\n                O, my lord!       7  -1.69"
    assert len(table_lines(texts)) == 3  # a row whose text cell has more words than the row has columns


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_no_table_wraps(path):
    wide = []
    for n, cell in enumerate(_cells(path)):
        for out in cell.get("outputs", []):
            longest = max(table_lines(_text(out)), key=len, default="")
            if len(longest) > TEXT_COLUMNS:
                wide.append(f"cell {n}: a table {len(longest)} characters wide ({longest.strip()[:40]!r}...)")
    assert not wide, (f"{path.name}: tables wider than JupyterLab's output area ({TEXT_COLUMNS} characters at 1280 px "
                      "with the file browser open) wrap: " + "; ".join(wide)
                      + " (nano_infer.viz.table_text splits a frame to fit)")


# -- the browser ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def page():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no chromium at {CHROMIUM} (make chromium, or CHROMIUM=/path)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_content(f"<html><body style='margin:0'><div id='box' style='width:{OUTPUT_WIDTH}px; overflow:hidden'>"
                         "</div></body></html>")
        page.add_script_tag(path=str(PLOTLY_JS))
        page.add_script_tag(content=MEASURE)
        yield page
        browser.close()


def test_text_columns_is_what_the_output_area_holds(page):
    """TEXT_COLUMNS is measured, not chosen: JupyterLab's code font at 13 px, one character of padding."""
    char = page.evaluate("""font => {
        const pre = document.createElement('pre');
        pre.style.cssText = 'display: inline-block; margin: 0; font-size: 13px';
        pre.style.fontFamily = font;
        pre.textContent = 'x'.repeat(100);
        document.body.appendChild(pre);
        const width = pre.getBoundingClientRect().width / 100;
        pre.remove();
        return width;
    }""", CODE_FONT)
    assert int(OUTPUT_WIDTH / char) - 1 == TEXT_COLUMNS, f"a character is {char:.3f} px wide"


# JS: draw one figure into the box as JupyterLab's renderer does (layout.height defaults to 360), measure, clear
MEASURE = """
window.measure = async (figure) => {
  const box = document.getElementById('box');
  const gd = document.createElement('div');
  box.appendChild(gd);
  const layout = Object.assign({}, figure.layout);
  if (!layout.height) layout.height = 360;
  await Plotly.newPlot(gd, figure.data, layout, figure.config || {});
  const problems = [];
  const limit = box.getBoundingClientRect();
  const svg = gd.querySelector('svg.main-svg').getBoundingClientRect();
  const right = Math.min(limit.right, svg.right);
  if (svg.width > limit.width + 0.5) problems.push(`the figure is ${Math.round(svg.width)} px wide`);
  const named = {'.legend': 'the legend', '.colorbar': 'a colour bar', '.slider-container': 'a slider',
                 '.updatemenu-container': 'the buttons', '.gtitle': 'the title', '.g-xtitle': 'an x axis title',
                 '.g-x2title': 'an x axis title', '.g-ytitle': 'a y axis title', '.annotation': 'an annotation',
                 '.xtick text': 'an x tick label', '.ytick text': 'a y tick label',
                 '.x2tick text': 'an x tick label', '.y2tick text': 'a y tick label'};
  for (const [selector, name] of Object.entries(named)) {
    for (const el of gd.querySelectorAll(selector)) {
      const r = el.getBoundingClientRect();
      if (!r.width || !r.height || getComputedStyle(el).visibility === 'hidden' || el.closest('[display="none"]')) continue;
      const text = (el.textContent || '').trim().slice(0, 30);
      if (r.left < svg.left - 1 || r.right > right + 1)
        problems.push(`${name} (${text}) spans x ${Math.round(r.left - svg.left)}..${Math.round(r.right - svg.left)} px`);
      if (r.top < svg.top - 1 || r.bottom > svg.bottom + 1)
        problems.push(`${name} (${text}) spans y ${Math.round(r.top - svg.top)}..${Math.round(r.bottom - svg.top)} px ` +
                      `of ${Math.round(svg.height)}`);
    }
  }
  for (const legend of gd.querySelectorAll('.legend')) {
    const bar = legend.querySelector('.scrollbar');
    if (bar && bar.getBoundingClientRect().height > 0 && bar.getBoundingClientRect().width > 0)
      problems.push('the legend scrolls (plotly cut it to fit)');
    const lr = legend.getBoundingClientRect();
    for (const label of gd.querySelectorAll('.xtick text, .x2tick text, .g-xtitle, .g-x2title, .ytick text, .g-ytitle')) {
      const r = label.getBoundingClientRect();
      if (r.width && lr.left < r.right - 1 && r.left < lr.right - 1 && lr.top < r.bottom - 1 && r.top < lr.bottom - 1)
        problems.push(`the legend covers the axis label "${(label.textContent || '').trim().slice(0, 30)}"`);
    }
  }
  for (const slider of gd.querySelectorAll('.slider-container')) {
    const ticks = [...slider.querySelectorAll('.slider-tick-rect')].map(t => t.getBoundingClientRect());
    ticks.forEach((t, i) => {
      window.scrollTo(0, Math.max(0, t.top + window.scrollY - 400));
      const r = slider.querySelectorAll('.slider-tick-rect')[i].getBoundingClientRect();
      const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
      if (!hit || hit.closest('.slider-container') !== slider)
        problems.push(`slider stop ${i + 1} of ${ticks.length} (x ${Math.round(r.left + r.width / 2 - limit.left)} px) ` +
                      `cannot be clicked: ${hit ? (hit.closest('.updatemenu-container') ? 'the buttons cover it' : 'it is outside the output area') : 'off the page'}`);
    });
    const gaps = ticks.slice(1).map((t, i) => t.left - ticks[i].left);
    if (gaps.length && Math.min(...gaps) < 4) problems.push(`slider stops ${Math.min(...gaps).toFixed(1)} px apart`);
  }
  Plotly.purge(gd);
  gd.remove();
  window.scrollTo(0, 0);
  return problems;
};
"""


@pytest.mark.parametrize("figure", _figures())
def test_figure_fits_the_output_area(page, figure):
    problems = page.evaluate("f => measure(f)", {k: figure[k] for k in ("data", "layout", "config") if k in figure})
    assert not problems, (f"at {OUTPUT_WIDTH} px (JupyterLab's output area, 1280 px window, file browser open): "
                          + "; ".join(dict.fromkeys(problems)))
