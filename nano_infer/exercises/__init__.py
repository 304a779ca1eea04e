"""Checked exercises: `from nano_infer.exercises import check`, then `check.<exercise>(your_code)`.

Each chapter's checkers live in `chNN_<slug>.py` next to this file and are found
automatically: a new chapter only adds its module. `check.<exercise>` prints a verdict in
plain words and returns a CheckResult (truthy when passed). Reference solutions are in the
repository's `solutions/NN_<slug>.py`.
"""
from __future__ import annotations

import importlib
import pkgutil

from .core import EXERCISES, CheckResult, Exercise, exercise

_loaded = False


def load_all() -> dict[str, Exercise]:
    """Import every chNN_*.py module of this package (registering its exercises); returns them by name."""
    global _loaded
    if not _loaded:
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            if info.name.startswith("ch") and info.name[2:4].isdigit():
                importlib.import_module(f"{__name__}.{info.name}")
        _loaded = True
    return EXERCISES


class _Check:
    """`check.<name>(candidate)` runs that exercise's checker; `check` alone lists them all."""

    def __getattr__(self, name: str) -> Exercise:
        if name.startswith("_"):
            raise AttributeError(name)
        exercises = load_all()
        if name not in exercises:
            raise AttributeError(f"no exercise named {name!r}; the exercises are: {', '.join(sorted(exercises))}")
        return exercises[name]

    def __dir__(self):
        return sorted(load_all())

    def __repr__(self) -> str:
        rows = [f"  chapter {ex.chapter}: check.{ex.name}" for ex in sorted(load_all().values(), key=lambda e: (e.chapter, e.name))]
        return "Exercises:\n" + "\n".join(rows)


check = _Check()

__all__ = ["check", "CheckResult", "exercise", "load_all"]
