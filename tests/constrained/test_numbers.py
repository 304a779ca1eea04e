"""JSON Schema numbers as regexes: integer ranges exact, bounded numbers never outside their bounds, digits bounded."""
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nano_infer.constrained.numbers import INTEGER, MAX_DIGITS, NUMBER, integer_range, numeric_regex

BOUND = st.integers(-10**6, 10**6)


@given(BOUND, BOUND, st.lists(BOUND, max_size=20))
def test_an_integer_range_matches_exactly_its_integers(a, b, probes):
    lo, hi = min(a, b), max(a, b)
    pattern = re.compile(integer_range(lo, hi))
    for v in probes + [lo, hi, lo - 1, hi + 1, 0, -1]:
        assert bool(pattern.fullmatch(str(v))) == (lo <= v <= hi), (lo, hi, v)
    assert not pattern.fullmatch("-0") and not pattern.fullmatch("007")


@given(st.integers(-60, 60), st.integers(0, 60), st.booleans(), st.booleans(), st.lists(st.integers(-300, 300), max_size=40))
def test_a_bounded_number_never_matches_outside_its_bounds(lo, width, lo_open, hi_open, quarters):
    hi = lo + width
    node = {"exclusiveMinimum" if lo_open else "minimum": lo, "exclusiveMaximum" if hi_open else "maximum": hi}
    if width == 0 and (lo_open or hi_open):
        return
    pattern = re.compile(numeric_regex("number", node, "#"))
    for v in [q / 4 for q in quarters] + [lo, hi, lo - 0.5, hi + 0.5]:
        if pattern.fullmatch(json.dumps(v)):
            assert (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi), (node, v)
    if not lo_open:
        assert pattern.fullmatch(str(lo))
    if not hi_open:
        assert pattern.fullmatch(str(hi))


def test_an_open_unit_interval_holds_its_fractions():
    """(0, 1) is pydantic's gt=0, lt=1 (a probability): no integer lies inside, numbers do; (-1, 0) mirrors it."""
    for node, inside, outside in (({"exclusiveMinimum": 0, "exclusiveMaximum": 1}, ["0.5", "0.001"], ["0", "1", "1.5", "-0.5"]),
                                  ({"exclusiveMinimum": -1, "exclusiveMaximum": 0}, ["-0.5", "-0.25"], ["0", "-1", "0.5"]),
                                  ({"exclusiveMinimum": -4, "exclusiveMaximum": -3}, ["-3.5"], ["-3", "-4", "-4.5"])):
        pattern = re.compile(numeric_regex("number", node, "#"))
        assert all(pattern.fullmatch(v) for v in inside) and not any(pattern.fullmatch(v) for v in outside), node
    with pytest.raises(ValueError, match="no integer lies between"):
        numeric_regex("integer", {"exclusiveMinimum": 0, "exclusiveMaximum": 1}, "#")


def test_unbounded_integers_and_numbers_have_bounded_digits():
    assert re.fullmatch(INTEGER, "9" * MAX_DIGITS) and not re.fullmatch(INTEGER, "9" * (MAX_DIGITS + 1))
    assert re.fullmatch(NUMBER, "-12.5e-3") and not re.fullmatch(NUMBER, "1." + "3" * (MAX_DIGITS + 1))


@pytest.mark.parametrize("digits", [16, 400, 4000])
def test_a_bound_of_too_many_digits_is_a_value_error_saying_how_many(digits):
    """An integer too large for a float (past ~309 digits) raised OverflowError; one past 4,300 digits cannot
    even be printed: the message counts its digits instead."""
    for key in ("minimum", "exclusiveMaximum"):
        with pytest.raises(ValueError, match=f"'{key}' at #.*numbers have at most {MAX_DIGITS} digits"):
            numeric_regex("integer", {"type": "integer", key: int("9" * digits)}, "#")
    with pytest.raises(ValueError, match="about 4000 digits"):
        numeric_regex("number", {"type": "number", "minimum": -int("9" * 4000)}, "#")
