"""The built book in a real headless Chromium: pages load clean, every figure draws, a stepper steps.

Run after `make book` (make test-book does both). The browser is Debian's chromium
(CHROMIUM=/path overrides), driven by Playwright; the site is served over local HTTP.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("BOOK_DIR", ROOT / "build" / "book"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PAGES = sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html") if not p.relative_to(SITE).parts[0].startswith("_"))
FIGURES = json.loads((SITE / "figures.json").read_text())
# JS: how many plotly figures on the page have drawn their SVG
DRAWN = "() => [...document.querySelectorAll('.plotly-graph-div')].filter(d => d._fullLayout && d.querySelector('svg.main-svg')).length"


@pytest.fixture(scope="module")
def base_url():
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def open_page(browser, url):
    """Load url; returns the page and the console errors and uncaught exceptions it produced."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(url, wait_until="load")
    return page, errors


def test_the_site_has_the_landing_page_every_notebook_and_every_solution():
    assert "index.html" in PAGES
    assert (ROOT / "README.md").read_text().splitlines()[0].lstrip("# ") in (SITE / "index.html").read_text()
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert notebooks == sorted(FIGURES)
    assert all(f"{n}.html" in PAGES for n in notebooks)
    for solution in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        page = SITE / "solutions" / f"{solution.stem}.html"
        assert page.exists(), f"no page for {solution.name}"
        first_def = next(line for line in solution.read_text().splitlines() if line.startswith("def "))
        assert first_def.split("(")[0].split()[1] in page.read_text()


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_and_every_figure_draws(browser, base_url, path):
    page, errors = open_page(browser, f"{base_url}/{path}")
    expected = FIGURES.get(path.removesuffix(".html"), {}).get("figures", 0)  # notebook pages: figures in the notebook
    if expected:
        page.wait_for_function(f"() => ({DRAWN})() >= {expected}", timeout=60_000)
    assert page.evaluate(DRAWN) == expected, f"{path}: figures drawn vs. figures in the notebook"
    assert page.evaluate("() => document.querySelectorAll('script[src^=\"http\"]').length") == 0, "a script from the network"
    page.close()
    assert errors == []


STEPPER_PAGES = [f"{name}.html" for name, counts in FIGURES.items() if counts["steppers"]]


def test_the_step_through_chapters_have_steppers():
    assert {"02_block_manager.html", "04_radix_tree.html", "07_constrained_decoding.html"} <= set(STEPPER_PAGES)


@pytest.mark.parametrize("path", STEPPER_PAGES)
def test_a_stepper_slider_moves_and_redraws(browser, base_url, path):
    page, errors = open_page(browser, f"{base_url}/{path}")
    page.wait_for_function(f"() => ({DRAWN})() >= {FIGURES[path.removesuffix('.html')]['figures']}", timeout=60_000)
    steppers = page.evaluate("() => [...document.querySelectorAll('.plotly-graph-div')]"
                             ".map((d, i) => d.layout.sliders && d.layout.sliders.length ? i : -1).filter(i => i >= 0)")
    assert steppers, "no figure with a slider on the page"
    plot = page.locator(".plotly-graph-div").nth(steppers[0])
    plot.scroll_into_view_if_needed()
    # what is drawn: the title and every trace's data (a frame may change either)
    title = lambda: plot.locator(".gtitle").first.text_content() + plot.evaluate(
        "d => JSON.stringify(d.data.map(t => [t.x, t.y, t.text, t.marker && t.marker.color]))")
    before, active = title(), plot.evaluate("d => d._fullLayout.sliders[0].active")
    at_end = active == plot.evaluate("d => d._fullLayout.sliders[0].steps.length") - 1  # a figure may open on its last step
    rail = plot.locator("rect.slider-rail-touch-rect").bounding_box()
    x = rail["x"] + (3 if at_end else rail["width"] - 3)  # the stop at the other end of the slider
    page.mouse.click(x, rail["y"] + rail["height"] / 2)
    page.wait_for_function(f"d => d._fullLayout.sliders[0].active != {active}", arg=plot.element_handle(), timeout=10_000)
    page.wait_for_timeout(300)
    assert plot.evaluate("d => d._fullLayout.sliders[0].active") != active
    assert title() != before, "the slider moved but the figure did not redraw"
    page.close()
    assert errors == []
