"""Part of a function's real source, for a chapter that discusses its loop and not its set-up (chapter 10).

`show_source` displays a whole function; a worker's `serve` opens with imports and model loading
that the chapter has covered already, so it shows the part from a given line on.
"""
from __future__ import annotations

import inspect
from pathlib import Path


def source_excerpt(obj, start: str) -> str:
    """`obj`'s source from its first line containing `start` to its end, under a line saying where it lives.

    A ValueError when no line contains `start`: an edited function breaks the chapter instead of
    showing some other part of it."""
    obj = inspect.unwrap(obj)
    lines, first = inspect.getsourcelines(obj)
    at = next((i for i, line in enumerate(lines) if start in line), None)
    if at is None:
        raise ValueError(f"no line of {obj.__qualname__} contains {start!r}")
    path = Path(inspect.getsourcefile(obj)).resolve()
    package_root = Path(__file__).resolve().parents[2]
    where = path.relative_to(package_root) if path.is_relative_to(package_root) else path.name
    return f"# {where}, lines {first + at}-{first + len(lines) - 1} (of {obj.__qualname__})\n" + "".join(lines[at:])


def show_source_excerpt(obj, start: str) -> None:
    """Display `source_excerpt(obj, start)` as code."""
    from IPython.display import Code, display

    display(Code(source_excerpt(obj, start), language="python"))
