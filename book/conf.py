"""Sphinx + MyST-NB settings for the book: the executed notebooks as they are committed, never re-run."""
project = "nano_infer"
author = "nano_infer"
extensions = ["myst_nb"]
nb_execution_mode = "off"  # the book shows the committed outputs; `make notebooks` is what executes
nb_ipywidgets_js = {}  # no widget manager from a CDN: build.py replaces live widgets with a note
html_static_path = ["_static"]
html_js_files = ["plotly.min.js"]  # bundled from the plotly package, so figures draw offline
html_theme = "alabaster"
html_theme_options = {"page_width": "1180px", "sidebar_width": "240px"}
html_title = "nano_infer"
html_favicon = "favicon.svg"  # browsers ask for one; without it every page logs a 404
exclude_patterns = ["_build"]
myst_heading_anchors = 3
suppress_warnings = ["myst.xref_missing", "myst.header", "misc.highlighting_failure"]
