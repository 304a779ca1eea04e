"""The course's glossary (notebooks/README.md) reaches every chapter that introduces terms: each of
chapters 01-13 is cited by at least one entry ("(chapter 13)", "chapters 03, 04, 12", "Chapter 12.")."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def chapters_cited(glossary: str) -> set[str]:
    cited = set()
    for m in re.finditer(r"[Cc]hapters? ((?:\d\d(?:, | and )?)+)", glossary):
        cited |= set(re.findall(r"\d\d", m.group(1)))
    return cited


def test_every_chapter_after_the_first_has_its_terms_in_the_glossary():
    text = (ROOT / "notebooks" / "README.md").read_text()
    glossary = text[text.index("## Glossary"):text.index("\n## ", text.index("## Glossary") + 1)]
    glossary = re.sub(r"<!--.*?-->", "", glossary, flags=re.DOTALL)  # notes to authors are not entries
    chapters = {p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")} - {"00"}
    assert chapters - chapters_cited(glossary) == set()


def test_the_check_reads_the_three_ways_an_entry_cites_chapters():
    assert chapters_cited("a (chapter 13). b (chapters 03, 04, 12). c, Chapter 09. d (chapters 07 and 08)") == \
        {"13", "03", "04", "12", "09", "07", "08"}
