"""A listing from a given line on starts at the asked-for line and numbers it as the file does."""
import importlib.util
import textwrap

import pytest

from nano_infer.viz import source_listing

SOURCE = textwrap.dedent('''\
    import os


    def serve(n):
        from math import sqrt
        total = 0
        for i in range(n):
            total += sqrt(i)
        return total
''')


@pytest.fixture
def serve(tmp_path):
    path = tmp_path / "worker_like.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("worker_like", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.serve


def test_excerpt_starts_at_the_line_and_keeps_the_file_s_numbers(serve):
    text = source_listing(serve, "total = 0")
    header, *body = text.splitlines()
    assert header.endswith("worker_like.py, lines 6-9 (of serve)")
    assert body == ["    total = 0", "    for i in range(n):", "        total += sqrt(i)", "    return total"]


def test_a_line_that_is_not_there_is_an_error(serve):
    with pytest.raises(ValueError, match="no line of serve contains 'while'"):
        source_listing(serve, "while")
