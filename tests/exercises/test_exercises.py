"""Every exercise's checker passes its reference solution and rejects its planted wrong answers.

Exercises are found from the package (every nano_infer/exercises/chNN_<slug>.py); the
reference is solutions/NN_<slug>.py, the wrong answers tests/exercises/wrong_NN_<slug>.py
(one function or class per mistake, named <exercise>__<what_is_wrong>).
"""
import importlib.util
from pathlib import Path

import pytest

from nano_infer.exercises import load_all
from nano_infer.exercises.core import chapter_module

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = sorted(load_all().values(), key=lambda e: (e.chapter, e.name))


def _load(path: Path):
    assert path.exists(), f"missing {path.relative_to(ROOT)}"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(ex):
    slug = chapter_module(ex).__name__.rsplit(".", 1)[-1][2:]  # "00_naive_decode"
    return ROOT / "solutions" / f"{slug}.py", ROOT / "tests" / "exercises" / f"wrong_{slug}.py"


def _wrong_answers():
    for ex in EXERCISES:
        wrong = _load(_files(ex)[1])
        names = sorted(n for n in vars(wrong) if n.startswith(ex.name + "__"))
        for name in names:
            yield pytest.param(ex, getattr(wrong, name), id=name)


def test_every_chapter_has_exercises():
    chapters = {ex.chapter for ex in EXERCISES}
    assert {f"{n:02d}" for n in range(9)} <= chapters, f"chapters with exercises: {sorted(chapters)}"


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_reference_passes(ex):
    reference = getattr(_load(_files(ex)[0]), ex.name)
    result = ex.run(reference)
    assert result.status == "passed", result.message


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_has_planted_wrong_answers(ex):
    wrong = _load(_files(ex)[1])
    assert any(n.startswith(ex.name + "__") for n in vars(wrong)), f"no planted wrong answer for {ex.name}"


@pytest.mark.parametrize("ex, candidate", list(_wrong_answers()))
def test_wrong_answer_fails_with_a_message(ex, candidate):
    result = ex.run(candidate)
    assert result.status == "failed", f"{candidate.__name__} was not rejected: {result.message}"
    assert not result
    assert "Traceback" not in result.message and len(result.message.splitlines()) >= 2, result.message


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda e: e.name)
def test_stub_is_not_attempted(ex):
    def stub(*args, **kwargs):
        raise NotImplementedError

    result = ex.run(stub)
    assert result.status == "not attempted" and "not attempted yet" in result.message and not result


def test_check_prints_the_verdict(capsys):
    from nano_infer.exercises import check

    ex = EXERCISES[0]
    result = getattr(check, ex.name)(lambda *a, **k: (_ for _ in ()).throw(NotImplementedError()))
    assert capsys.readouterr().out.strip() == result.message
    with pytest.raises(AttributeError, match="no exercise named"):
        check.no_such_exercise
