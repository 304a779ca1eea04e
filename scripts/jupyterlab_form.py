"""Rewrite notebooks in the form JupyterLab saves them in, so that opening and saving one changes nothing.

JupyterLab parses a notebook in the browser and sends it back as JSON written by JavaScript, which
has one kind of number: a float such as 1.0 in a plotly figure comes back as 1. The server then
writes it with nbformat (sorted keys, one-space indent, lines split, a final newline). Doing both
here makes a committed notebook a fixed point of that round trip; `make notebooks` runs it after
executing them, and tests/test_notebook_form.py checks every committed notebook.

    python scripts/jupyterlab_form.py notebooks/*.ipynb
"""
from __future__ import annotations

import json
import sys

import nbformat


def js_numbers(value):
    """What JSON.parse then JSON.stringify does to numbers: a whole float below 1e21 becomes an int."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, list):
        return [js_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: js_numbers(v) for k, v in value.items()}
    return value


def jupyterlab_form(text: str) -> str:
    """The text a notebook has after JupyterLab opened and saved it."""
    out = nbformat.writes(nbformat.from_dict(js_numbers(json.loads(text))))
    return out if out.endswith("\n") else out + "\n"


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        form = jupyterlab_form(text)
        if form != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(form)
            print(f"{path}: rewritten in JupyterLab's form")
