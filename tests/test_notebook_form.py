"""Opening a committed notebook in JupyterLab and saving it changes nothing (no diff nobody made)."""
import importlib.util
import json
import re
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


def chapters_cited(glossary: str) -> set[str]:
    cited = set()
    for m in re.finditer(r"[Cc]hapters? ((?:\d\d(?:, | and )?)+)", glossary):
        cited |= set(re.findall(r"\d\d", m.group(1)))
    return cited


def test_every_chapter_after_the_first_has_its_terms_in_the_glossary():
    """The glossary (notebooks/README.md) cites each chapter 01-13 in at least one entry ("(chapter 13)",
    "chapters 03, 04, 12", "Chapter 12.")."""
    text = (ROOT / "notebooks" / "README.md").read_text()
    glossary = text[text.index("## Glossary"):text.index("\n## ", text.index("## Glossary") + 1)]
    glossary = re.sub(r"<!--.*?-->", "", glossary, flags=re.DOTALL)  # notes to authors are not entries
    chapters = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")} - {"00"}
    assert chapters - chapters_cited(glossary) == set()


# words chapter 13 uses before (or without) saying what they are: each needs an entry a reader can look up
CHAPTER_13_WORDS = ["GGUF", "aten calls", "CPU time", "int8 (per row)", "Q4_1", "Q8_0", "Roofline, ridge",
                    "Memory-bandwidth floor", "CUDA graph"]


def test_chapter_13s_words_are_glossary_entries():
    text = (ROOT / "notebooks" / "README.md").read_text()
    glossary = text[text.index("## Glossary"):]
    entries = " ".join(re.findall(r"^- \*\*(.+?)\*\*", glossary, re.M)) + " ".join(re.findall(r'"(.+?)"', glossary))
    assert [w for w in CHAPTER_13_WORDS if w not in entries] == []


def test_the_check_reads_the_three_ways_an_entry_cites_chapters():
    assert chapters_cited("a (chapter 13). b (chapters 03, 04, 12). c, Chapter 09. d (chapters 07 and 08)") == \
        {"13", "03", "04", "12", "09", "07", "08"}
