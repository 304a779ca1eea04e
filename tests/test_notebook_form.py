"""Opening a committed notebook in JupyterLab and saving it changes nothing (no diff nobody made)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("jupyterlab_form", ROOT / "scripts/jupyterlab_form.py")
form = importlib.util.module_from_spec(spec)
spec.loader.exec_module(form)
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_is_what_jupyterlab_would_save(path):
    text = path.read_text(encoding="utf-8")
    assert form.jupyterlab_form(text) == text, f"run: python scripts/jupyterlab_form.py {path.relative_to(ROOT)}"


def test_a_whole_float_is_rewritten_as_javascript_writes_it():
    nb = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))
    nb["metadata"]["x"] = {"width": 1.0, "ratio": 0.25, "big": 1e22}
    text = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    again = json.loads(form.jupyterlab_form(text))["metadata"]["x"]
    assert again == {"width": 1, "ratio": 0.25, "big": 1e22} and isinstance(again["width"], int)
    assert form.jupyterlab_form(form.jupyterlab_form(text)) == form.jupyterlab_form(text)
