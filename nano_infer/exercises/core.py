"""The machinery behind `check.<exercise>(your_code)`: run a checker, answer in plain words.

A checker is a function decorated with `@exercise`. It calls the learner's code through
`call(...)` on cases it builds (by hand, or drawn by hypothesis through `forall`) and says
what is wrong with `expect(...)` or by raising `Mismatch`. The wrapper turns whatever
happens into a `CheckResult`:

- the learner's stub raised NotImplementedError -> "not attempted" (never an error);
- a `Mismatch` -> "failed", with the case, what was expected and what came back. Under
  `forall`, hypothesis first shrinks the case to the smallest one that still fails;
- the learner's code raised -> "failed", naming the case and the exception in one line
  (no traceback from the checker's or the library's insides);
- otherwise -> "passed".
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import hypothesis
from hypothesis import HealthCheck, Phase

EXERCISES: dict[str, "Exercise"] = {}

# Each property check tries this many cases (hypothesis examples) unless the checker asks for fewer.
MAX_EXAMPLES = 40


@dataclass
class CheckResult:
    """What a check found. Truthy when the exercise passed."""

    exercise: str
    status: str  # "passed" | "failed" | "not attempted"
    message: str

    def __bool__(self) -> bool:
        return self.status == "passed"

    def __str__(self) -> str:
        return self.message

    def _ipython_display_(self) -> None:
        """The verdict was printed when the check ran; a notebook shows nothing twice."""


class NotAttempted(Exception):
    """The learner's code raised NotImplementedError: the stub is still a stub."""


class Mismatch(Exception):
    """One case on which the learner's code is wrong, described for a person."""

    def __init__(self, case: str, expected: Any = None, got: Any = None, why: str = ""):
        super().__init__(case)
        self.case, self.expected, self.got, self.why = case, expected, got, why

    def describe(self) -> str:
        lines = [f"On {self.case}:"]
        if self.why:
            lines.append(f"  {self.why}")
        if self.expected is not None or self.got is not None:
            lines.append(f"  expected: {_short(self.expected)}")
            lines.append(f"  got:      {_short(self.got)}")
        return "\n".join(lines)


def _short(value: Any, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect(ok: bool, case: str, expected: Any = None, got: Any = None, why: str = "") -> None:
    """Raise a Mismatch describing `case` unless `ok`."""
    if not ok:
        raise Mismatch(case, expected, got, why)


def call(fn: Callable, *args, case: str, **kwargs):
    """Call the learner's code on one case; its exceptions become plain-words failures."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        raise NotAttempted() from e
    except (Mismatch, NotAttempted):
        raise
    except Exception as e:  # the learner's code crashed: say where and how, without a traceback
        raise Mismatch(case, why=f"your code raised {type(e).__name__}: {e}") from None


def forall(strategy, prop: Callable[[Any], None], max_examples: int = MAX_EXAMPLES, examples=()) -> None:
    """Run `prop(case)` on cases drawn from `strategy`, then on `examples`; raise the first failure found.

    A failure among the drawn cases is first shrunk by hypothesis to the smallest case that
    still fails. Deterministic (the same cases every run, nothing written to disk), so a notebook and
    `make test` see the same verdict.
    """
    stub = []

    def test(case):
        if stub:  # the stub raised once: no point drawing more cases
            return
        try:
            prop(case)
        except NotAttempted:
            stub.append(True)
        except (Mismatch, hypothesis.errors.HypothesisException):
            raise
        except Exception as e:  # the answer had a shape the checker could not read: say on which case
            raise Mismatch(f"the case {_short(case)}", why=f"checking your answer raised {type(e).__name__}: {e} "
                           "(does it return what the docstring asks for?)") from None

    def run(phases, cases=()):
        check = hypothesis.given(strategy)(test)
        for case in cases:
            check = hypothesis.example(case)(check)
        hypothesis.settings(
            max_examples=max_examples, deadline=None, database=None, derandomize=True, phases=phases,
            report_multiple_bugs=False, print_blob=False, suppress_health_check=list(HealthCheck))(check)()

    try:
        run((Phase.generate, Phase.shrink))
        if examples and not stub:  # hand-picked cases a known mistake shows on, after the shrunk search
            run((Phase.explicit,), examples)
    except (Mismatch, NotAttempted):
        raise
    except hypothesis.errors.HypothesisException as e:  # e.g. the learner's code is not deterministic
        raise Mismatch("several random cases", why=f"the check could not settle on a verdict: {e}") from None
    if stub:
        raise NotAttempted()


@dataclass
class Exercise:
    name: str
    chapter: str  # "00", "01", ...: the module ch00_naive_decode.py holds chapter 00's exercises
    checker: Callable[[Any], None]
    summary: str

    def __call__(self, candidate, *, quiet: bool = False) -> CheckResult:
        result = self.run(candidate)
        if not quiet:
            print(result.message)
        return result

    def run(self, candidate) -> CheckResult:
        try:
            self.checker(candidate)
        except NotAttempted:
            return CheckResult(self.name, "not attempted",
                               f"{self.name}: not attempted yet (your code still raises NotImplementedError).")
        except Mismatch as m:
            return CheckResult(self.name, "failed", f"{self.name}: not yet right.\n{m.describe()}")
        except Exception as e:  # the answer had a shape the checker could not read (None, wrong type, ...)
            return CheckResult(self.name, "failed", f"{self.name}: not yet right. Checking your answer "
                               f"raised {type(e).__name__}: {e} (does it return what the docstring asks for?)")
        return CheckResult(self.name, "passed", f"{self.name}: passed. {self.summary}")

    def __repr__(self) -> str:
        return f"<exercise {self.name} (chapter {self.chapter}): {self.summary}>"


def exercise(checker: Callable[[Any], None]) -> Exercise:
    """Register a checker under its function name. Its docstring's first line says what passing proves."""
    module = checker.__module__.rsplit(".", 1)[-1]  # chNN_<slug>
    if not (module.startswith("ch") and module[2:4].isdigit()):
        raise ValueError(f"exercise {checker.__name__} must live in a module named chNN_<slug>, not {module}")
    if checker.__name__ in EXERCISES:
        raise ValueError(f"two exercises are named {checker.__name__}")
    summary = (checker.__doc__ or "").strip().splitlines()[0] if checker.__doc__ else ""
    ex = Exercise(checker.__name__, module[2:4], checker, summary)
    EXERCISES[ex.name] = ex
    return ex


def chapter_module(ex: Exercise):
    """The chNN_<slug> module an exercise lives in (its slug names the solution files)."""
    return sys.modules[ex.checker.__module__]
